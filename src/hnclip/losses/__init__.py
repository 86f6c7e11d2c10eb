"""Training objectives in open_clip's ClipLoss style: global InfoNCE (`contrastive`), the FILIP
token-level term, exact large-batch (GradCache) computation of either global loss, and the HN-CLIP
objective of one batch with L_HN's margins (`objective`, whose pieces the baselines' objectives share)."""
from hnclip.losses.contrastive import ContrastiveLoss, infonce_logits, infonce_loss
from hnclip.losses.gradcache import GradCache, gradcache_backward, split_micro_batches
from hnclip.losses.objective import (
           MARGIN_CONTROLS,
           constant_margins,
           hn_logits,
           hn_loss,
           margin_matrix,
           shuffled_margins,
)
from hnclip.losses.token import (
           TokenAlignmentLoss,
           late_interaction_similarities,
           token_alignment_loss,
)

__all__ = ["ContrastiveLoss", "hn_loss", "infonce_loss", "hn_logits", "infonce_logits", "margin_matrix",
           "MARGIN_CONTROLS", "constant_margins", "shuffled_margins",
           "TokenAlignmentLoss", "late_interaction_similarities", "token_alignment_loss",
           "GradCache", "gradcache_backward", "split_micro_batches"]
