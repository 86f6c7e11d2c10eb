"""Training objectives: global InfoNCE / HN margins, and (when present) the token-level term."""
from .contrastive import ContrastiveLoss, HNClipLoss, hn_loss, infonce_loss, margin_matrix

__all__ = ["ContrastiveLoss", "HNClipLoss", "hn_loss", "infonce_loss", "margin_matrix"]
