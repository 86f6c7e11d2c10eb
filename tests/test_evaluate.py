"""Recall@K on hand-made similarity matrices, ties included, and epoch selection."""
from types import SimpleNamespace

import pytest
import torch

from hnclip.commands import evaluate as evaluate_step
from hnclip.evaluation.retrieval import ranks_of_positives, recall_at_k
from hnclip.evaluation.selection import mean_r1, rsum, select_epochs


def test_ranks_on_hand_made_scores():
    scores = torch.tensor([[0.9, 0.1, 0.2],
                           [0.8, 0.5, 0.1],    # query 1: one candidate above its ground truth
                           [0.3, 0.4, 0.2]])   # query 2: two above
    ranks, tied = ranks_of_positives(scores)
    assert ranks.tolist() == [0, 1, 2] and tied.tolist() == [False, False, False]


def test_ties_follow_the_declared_rule():
    scores = torch.tensor([[0.5, 0.5, 0.1],    # tie with the ground truth
                           [0.2, 0.7, 0.7],    # tie
                           [0.1, 0.1, 0.1]])   # three-way tie
    pess, tied = ranks_of_positives(scores, "pessimistic")
    opt, _ = ranks_of_positives(scores, "optimistic")
    assert pess.tolist() == [1, 1, 2] and opt.tolist() == [0, 0, 0]
    assert tied.tolist() == [True, True, True]
    with pytest.raises(ValueError, match="tie_rule"):
        ranks_of_positives(scores, "random")


def test_recall_both_directions_hand_computed():
    # Identity-like features: image i matches caption i, except caption 2 is closest to image 0.
    img = torch.eye(3)
    txt = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.8, 0.0, 0.6]])
    m = recall_at_k(img, txt, ks=(1, 2), tie_rule="pessimistic")
    # sims[i, j] = img_i . txt_j = [[1, 0, .8], [0, 1, 0], [0, 0, .6]]
    # t2i: caption 2 ranks image 2 (0.6) below image 0 (0.8) -> rank 1
    assert m["t2i"] == {"R@1": pytest.approx(200 / 3), "R@2": 100.0}
    # i2t: image 0 ranks caption 0 (1.0) above caption 2 (0.8); image 2 ranks caption 2 (0.6) first
    assert m["i2t"] == {"R@1": 100.0, "R@2": 100.0}
    assert m["ties"] == {"t2i": 0, "i2t": 0} and m["n"] == 3


def test_duplicate_captions_count_as_ties():
    img = torch.eye(2)
    txt = torch.tensor([[1.0, 1.0], [1.0, 1.0]]) / 2 ** 0.5  # two identical captions
    pess = recall_at_k(img, txt, ks=(1,), tie_rule="pessimistic")
    opt = recall_at_k(img, txt, ks=(1,), tie_rule="optimistic")
    assert pess["i2t"]["R@1"] == 0.0 and opt["i2t"]["R@1"] == 100.0
    assert pess["ties"]["i2t"] == 2


def test_recall_requires_paired_features():
    with pytest.raises(ValueError, match="one caption per image"):
        recall_at_k(torch.eye(3), torch.eye(4)[:, :3][:2])


def test_select_epochs_best_and_last():
    def m(t, i):
        return {"t2i": {"R@1": t}, "i2t": {"R@1": i}}
    history = [{"epoch": 1, "eval": {"docci": m(50, 50)}}, {"epoch": 2, "eval": {"docci": m(60, 58)}},
               {"epoch": 3, "eval": {"docci": m(58, 60)}}, {"epoch": 4, "eval": {"docci": m(55, 55)}}]
    chosen = select_epochs(history, "docci")
    assert chosen["best"]["epoch"] == 2  # tie in mean R@1 between epochs 2 and 3: earliest wins
    assert chosen["last"]["epoch"] == 4 and mean_r1(chosen["last"]["metrics"]) == 55
    with pytest.raises(KeyError, match="urban1k"):
        select_epochs(history, "urban1k")


def test_the_selection_metric_decides_the_best_epoch():
    """Epoch 1 has the higher mean R@1, epoch 2 the higher sum of all recalls: the metric picks."""
    history = [{"epoch": 1, "eval": {"docci": {"t2i": {"R@1": 50.0, "R@5": 60.0}, "i2t": {"R@1": 50.0, "R@5": 60.0}}}},
               {"epoch": 2, "eval": {"docci": {"t2i": {"R@1": 48.0, "R@5": 90.0}, "i2t": {"R@1": 48.0, "R@5": 90.0}}}},
               {"epoch": 3, "eval": {"docci": {"t2i": {"R@1": 10.0, "R@5": 20.0}, "i2t": {"R@1": 10.0, "R@5": 20.0}}}}]
    assert mean_r1(history[0]["eval"]["docci"]) > mean_r1(history[1]["eval"]["docci"])
    assert rsum(history[1]["eval"]["docci"]) == 276 > rsum(history[0]["eval"]["docci"]) == 220
    by_mean_r1, by_rsum = (select_epochs(history, "docci", metric) for metric in ("mean_r1", "rsum"))
    assert (by_mean_r1["best"]["epoch"], by_mean_r1["metric"]) == (1, "mean_r1")
    assert (by_rsum["best"]["epoch"], by_rsum["metric"]) == (2, "rsum")
    assert by_mean_r1["last"] == by_rsum["last"] and by_rsum["last"]["epoch"] == 3
    with pytest.raises(KeyError, match="best_of_three"):
        select_epochs(history, "docci", "best_of_three")
    # `hnclip evaluate` selects with params.yaml's evaluation.selection_metric
    record = {"history": [{**h, "weights_sha256": f"w{h['epoch']}"} for h in history]}
    for metric, epoch in (("mean_r1", 1), ("rsum", 2)):
        registry = SimpleNamespace(params={"evaluation": {"selection_metric": metric}})
        chosen = evaluate_step._select(registry, record, "docci")
        assert chosen["best"]["epoch"] == epoch and chosen["best"]["weights_sha256"] == f"w{epoch}"


def test_test_set_encoding_matches_per_item_features(tiny_data, tiny_state, one_thread):
    """Captions are encoded in length order (and images once per set of weights), yet every feature is
    the one open_clip's own encoders give that item, in manifest order; a split showing the same images
    (Long-DCI's re-described DCI test images) reuses the image features instead of encoding them again."""
    from helpers.batches import tiny_model

    from hnclip.data.loader import PairDataset
    from hnclip.evaluation import retrieval
    from hnclip.models.factory import create
    backbone, model = create("hnclip-tiny"), tiny_model(tiny_state).eval()
    data = PairDataset.from_manifest(tiny_data["test"], backbone.preprocess, backbone.tokenizer)
    lengths = data.tokens.argmax(dim=-1)
    assert lengths.unique().numel() > 3  # captions of many lengths: the length order is not the manifest's
    img, txt = retrieval.encode_dataset(model, data, batch_size=5)
    with torch.no_grad():
        expected_txt = torch.nn.functional.normalize(model.encode_text(data.tokens), dim=-1)
        expected_img = torch.nn.functional.normalize(
            model.encode_image(torch.stack([data.image(i) for i in range(len(data))])), dim=-1)
    torch.testing.assert_close(txt, expected_txt, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(img, expected_img, rtol=1e-5, atol=1e-5)

    encoded = []
    real = retrieval.encode_images
    monkey = pytest.MonkeyPatch()
    monkey.setattr(retrieval, "encode_images", lambda *a, **k: encoded.append(1) or real(*a, **k))
    try:
        shared: dict = {}
        first = retrieval.evaluate_model(model, data, (1, 5), "pessimistic", 8, image_features=shared)
        again = retrieval.evaluate_model(model, data, (1, 5), "pessimistic", 8, image_features=shared)
        alone = retrieval.evaluate_model(model, data, (1, 5), "pessimistic", 8)
    finally:
        monkey.undo()
    assert len(encoded) == 2  # the shared call reused the first call's image features; the lone one encoded
    assert first == again == alone
