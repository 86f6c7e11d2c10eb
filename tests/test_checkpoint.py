"""Resume checkpoints that survive crashes: written in the background from a host copy, the previous one
kept until the new one is complete and checked, a newest that does not load replaced by the one before,
stale temporary files removed, every atomic write synced to disk."""
import os

import torch

import hnclip.io
from hnclip.io import write_json
from hnclip.training.checkpoint import (
    CheckpointWriter,
    checkpoint_path,
    load_checkpoint,
    previous_checkpoint_path,
    remove_stale_parts,
)
from hnclip.training.frameworks import TrainedModel
from hnclip.training.state import LoopState


def model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return TrainedModel("full", model), torch.optim.AdamW(model.parameters(), lr=0.1)


def train_step(trained, optimizer) -> None:
    optimizer.zero_grad()
    trained.module(torch.ones(2, 4)).sum().backward()
    optimizer.step()


def weights(trained) -> dict:
    return {k: v.clone() for k, v in trained.module.state_dict().items()}


def test_a_truncated_newest_checkpoint_resumes_from_the_previous_one(tmp_path, capsys):
    trained, optimizer = model_and_optimizer(0)
    writer = CheckpointWriter(tmp_path)
    train_step(trained, optimizer)
    writer.save("s" * 64, trained, optimizer, LoopState(epoch=1, step=1))
    at_step_1 = weights(trained)
    train_step(trained, optimizer)  # while the writer may still be writing step 1: it writes its own copy
    writer.save("s" * 64, trained, optimizer, LoopState(epoch=1, group=1, step=2))
    writer.wait()
    assert writer.written == 2
    assert torch.load(checkpoint_path(tmp_path), weights_only=True)["state"]["step"] == 2
    assert torch.load(previous_checkpoint_path(tmp_path), weights_only=True)["state"]["step"] == 1

    newest = checkpoint_path(tmp_path)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a crash cut it short
    fresh, fresh_optimizer = model_and_optimizer(1)
    restored = load_checkpoint(tmp_path, "s" * 64, fresh, fresh_optimizer)
    assert (restored.state["epoch"], restored.state["step"]) == (1, 1)
    assert restored.path == previous_checkpoint_path(tmp_path)
    assert restored.record()["checkpoint"] == "previous.pt" and restored.record()["failed"][0].startswith("last.pt: ")
    assert all(torch.equal(fresh.module.state_dict()[k], v) for k, v in at_step_1.items())
    assert "last.pt: does not load" in capsys.readouterr().err

    previous_checkpoint_path(tmp_path).write_bytes(b"")  # neither loads: the run trains afresh
    assert load_checkpoint(tmp_path, "s" * 64, fresh, fresh_optimizer) is None


def test_the_copy_is_taken_at_save_time(tmp_path):
    trained, optimizer = model_and_optimizer(0)
    writer = CheckpointWriter(tmp_path)
    saved = weights(trained)
    writer.save("s" * 64, trained, optimizer, LoopState(step=1))
    with torch.no_grad():
        trained.module.weight.add_(1.0)  # training goes on while the thread writes
    writer.wait()
    payload = torch.load(checkpoint_path(tmp_path), weights_only=True)
    assert torch.equal(payload["model"]["weight"], saved["weight"])
    assert writer.summary()["written"] == 1 and writer.summary()["host_copy_s"] >= 0


def test_stale_part_files_of_a_killed_save_are_removed(tmp_path):
    (tmp_path / ".last.pt.k1t2x.part").write_bytes(b"half a checkpoint")
    (tmp_path / "last.pt").write_bytes(b"kept")
    assert [p.name for p in remove_stale_parts(tmp_path)] == [".last.pt.k1t2x.part"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_atomic_writes_sync_the_file_and_its_directory(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(hnclip.io.os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}"))
                        or real_fsync(fd))
    write_json(tmp_path / "record.json", {"a": 1})
    assert len(synced) == 2
    assert synced[0].startswith(str(tmp_path / ".record.json.")) and synced[0].endswith(".part")  # before the rename
    assert synced[1] == str(tmp_path)  # after it


def test_a_mid_epoch_checkpoint_is_due_by_wall_time_or_by_steps():
    from hnclip.training.loop import checkpoint_due
    assert not checkpoint_due({}, step=7, since_s=599.0) and checkpoint_due({}, step=7, since_s=600.0)  # 10 min
    assert checkpoint_due({"checkpoint_every_minutes": 0.5}, step=7, since_s=30.0)
    assert checkpoint_due({"checkpoint_every_steps": 7}, step=14, since_s=1.0)
    assert not checkpoint_due({"checkpoint_every_steps": 7}, step=15, since_s=1.0)


def test_train_takes_until_epoch_from_the_command_line():
    from hnclip.cli import build_parser
    args = build_parser().parse_args(["train", "--run-id", "r", "--until-epoch", "3"])
    assert (args.run, args.until_epoch) == ("r", 3)
    assert build_parser().parse_args(["train", "--run-id", "r"]).until_epoch is None
