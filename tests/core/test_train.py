"""Head training (docs/training.md): trainer registration through the hook, the trainer contract, and the loop
(schedule, held-out split, batches, checkpoints: a resumed run ends with the weights of an uninterrupted one).

Uses the fixture distribution tests/fixtures/specdec-plugin-skiphead (entry point `skiphead`, a trainer for
method skiphead, no proposer), installed for real by `make install`.
"""

from __future__ import annotations

import importlib.metadata as importlib_metadata
import json
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import specdec
from specdec import registry
from specdec_tools.train import (
    CHECKPOINT,
    LAST,
    Batch,
    TargetInfo,
    Trainer,
    build_trainer,
    held_out_split,
    lr_at,
    train,
)
from specdec_tools.train_loop import batch_indices

_INSTALLED = {ep.name for ep in importlib_metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}
needs_skiphead = pytest.mark.skipif("skiphead" not in _INSTALLED, reason="fixture plugin not installed: pip install "
                                    "tests/fixtures/specdec-plugin-skiphead")
STDLIB = Path(sysconfig.get_paths()["stdlib"])
TEXT_FILES = [str(STDLIB / n) for n in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py")]


@pytest.fixture
def fresh_registry(monkeypatch):
    monkeypatch.delenv("SPECDEC_PLUGINS", raising=False)
    monkeypatch.delenv("SPECDEC_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.setattr(registry, "_REGISTRY", registry._REGISTRY)  # restored on teardown
    registry._reset()


@pytest.fixture
def register_trainer():
    """Register trainer classes by hand for one test (a plugin per call); unregistered afterwards."""
    names = []

    def register(*classes, name):
        class _Plugin:
            @specdec.hookimpl
            def specdec_register_trainers(self, register):
                for cls in classes:
                    register(cls)

        specdec.register_plugin(_Plugin(), name=name)
        names.append(name)

    yield register
    for n in names:
        specdec.unregister_plugin(n)


class _Good(Trainer):
    method = "good_trained"

    def build_head(self):
        return torch.nn.Linear(2, 2)

    def loss(self, batch):
        return self.head.weight.sum()

    def acceptance(self, batch):
        return torch.ones(1, 1, dtype=torch.bool)

    def save(self, out_dir):
        pass


class _Abstract(Trainer):
    method = "half_done"

    def build_head(self):
        return torch.nn.Linear(2, 2)


class _NoMethod(_Good):
    method = ""


class _BadOptions(_Good):
    method = "bad_options"
    Options = dict


class _NotATrainer:
    method = "not_a_trainer"


# ---------------------------------------------------------------- registry


@needs_skiphead
def test_fixture_trainer_is_discoverable(fresh_registry):
    from specdec_skiphead.trainer import SkipheadTrainer

    assert registry.get_trainer_class("skiphead") is SkipheadTrainer
    assert registry._REGISTRY.tried == {"skiphead"}  # the plugin named like the method, and no other
    info = registry.available_trainers()["skiphead"]
    assert (info.plugin, info.distribution, info.version, info.status) == ("skiphead", "specdec-plugin-skiphead",
                                                                          "0.1.0", "ok")
    assert info.trainer_class is SkipheadTrainer
    assert registry.get_trainer_class("skiphead") is SkipheadTrainer
    assert "skiphead" not in specdec.available_methods()  # a trainer, not a proposer


@needs_skiphead
def test_loading_plugins_imports_no_training_code():
    """The trainer hook runs on demand: decoding (which loads every plugin) never imports training code."""
    code = ("import sys, specdec\nspecdec.available_methods()\n"
            "print(sorted(m for m in ('specdec_skiphead.trainer', 'specdec_tools.train', 'specdec_tools.train_data') "
            "if m in sys.modules), 'specdec_skiphead' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "[] True"


@pytest.mark.parametrize("cls, message", [
    (_NotATrainer, "register() got <class 'test_train._NotATrainer'>; expected a subclass of "
                   "specdec_tools.train.Trainer."),
    (_NoMethod, "_NoMethod.method = '' is invalid: it must be a non-empty identifier such as 'medusa' (the method "
                "whose head it trains, the name users pass as --method)."),
    (_Abstract, "_Abstract must implement acceptance, loss, save (see specdec_tools.train.Trainer and "
                "docs/training.md)."),
    (_BadOptions, "_BadOptions.Options = <class 'dict'> must be a dataclass of the method's options."),
])
def test_invalid_trainer_is_reported_for_its_plugin(fresh_registry, register_trainer, monkeypatch, cls, message):
    monkeypatch.setenv("SPECDEC_DISABLE_PLUGIN_AUTOLOAD", "1")
    register_trainer(_Good, cls, name="bad-trainers")
    info = registry.available_trainers()["bad-trainers"]
    assert info.status == "error"
    assert info.error == f"specdec.errors.PluginValidationError: Plugin 'bad-trainers': {message}"
    assert "good_trained" not in registry.available_trainers()  # the plugin keeps none of its trainers
    with pytest.raises(specdec.UnknownMethodError) as exc:
        registry.get_trainer_class("good_trained")
    assert f"Plugins that failed to load: bad-trainers (trainers): specdec.errors.PluginValidationError: Plugin " \
           f"'bad-trainers': {message}" in str(exc.value)


def test_two_plugins_training_one_method(fresh_registry, register_trainer, monkeypatch):
    monkeypatch.setenv("SPECDEC_DISABLE_PLUGIN_AUTOLOAD", "1")
    register_trainer(_Good, name="first-trainer")
    register_trainer(type("Again", (_Good,), {}), name="second-trainer")
    trainers = registry.available_trainers()
    assert trainers["good_trained"].plugin == "first-trainer"
    assert trainers["second-trainer"].error == (
        "specdec.errors.PluginValidationError: Plugin 'second-trainer': a trainer for method 'good_trained' (Again) "
        "is already registered by plugin 'first-trainer'; pick another method name or uninstall one of the two "
        "plugins.")


@needs_skiphead
def test_unknown_trainer_names_the_method_the_trainers_and_the_fix(fresh_registry):
    with pytest.raises(specdec.UnknownMethodError) as exc:
        registry.get_trainer_class("nope")
    text = str(exc.value)
    trained = ", ".join(sorted(registry.available_trainers()))  # skiphead, and eagle/eagle3 where installed
    assert "skiphead" in trained
    assert text.startswith(f"No trainer for method 'nope'. Methods with trainers: {trained}. Install a plugin that "
                           "trains it with: pip install specdec-plugin-<name> (e.g. pip install specdec-plugin-nope)")
    with pytest.raises(specdec.UnknownMethodError, match=r"^method='' is invalid: it must be a method name"):
        registry.get_trainer_class("")


@needs_skiphead
@pytest.mark.skipif("copycat" not in _INSTALLED, reason="fixture plugin copycat not installed")
def test_installed_method_without_trainer_says_so(fresh_registry):
    with pytest.raises(specdec.UnknownMethodError) as exc:
        registry.get_trainer_class("copycat")
    trained = ", ".join(sorted(registry.available_trainers()))
    assert str(exc.value).startswith(
        f"No trainer for method 'copycat'. Methods with trainers: {trained}. Method 'copycat' is installed (plugin "
        "'copycat') but no plugin registers a trainer for it: install one that does (pip install "
        "specdec-plugin-<name>), or train its head elsewhere.")


# ---------------------------------------------------------------- loop pieces


def test_lr_schedule_is_zoos_warmup_then_cosine_to_ten_percent():
    assert [lr_at(s, 1.0, 4, 20) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, 1.0, 4, 20) == pytest.approx(1.0)
    assert lr_at(12, 1.0, 4, 20) == pytest.approx(0.55)
    assert lr_at(20, 1.0, 4, 20) == pytest.approx(0.1)
    assert lr_at(0, 2.0, 0, 10) == pytest.approx(2.0)


def test_held_out_split_is_fixed_disjoint_and_never_empty():
    train_ids, held = held_out_split(100, 0.05)
    assert len(held) == 5 and len(train_ids) == 95 and not set(train_ids) & set(held)
    assert held_out_split(100, 0.05) == (train_ids, held)
    assert held_out_split(2, 0.01) == ([i for i in range(2) if i not in held_out_split(2, 0.01)[1]],
                                       held_out_split(2, 0.01)[1])
    assert len(held_out_split(3, 0.99)[0]) == 1
    with pytest.raises(ValueError, match="the data holds 1 sequence"):
        held_out_split(1, 0.5)


def test_batches_are_a_pure_function_of_step_and_seed():
    ids = list(range(10, 17))
    run = [batch_indices(ids, s, 3, 5, {}) for s in range(7)]
    cache: dict = {}
    assert [batch_indices(ids, s, 3, 5, cache) for s in range(7)] == run
    assert batch_indices(ids, 4, 3, 5, {}) == run[4]
    flat = [i for b in run for i in b]
    assert sorted(flat[:7]) == ids and sorted(flat[7:14]) == ids  # every sequence once per epoch
    assert run != [batch_indices(ids, s, 3, 6, {}) for s in range(7)]


def test_batch_checks_shapes():
    ids = torch.zeros(2, 5, dtype=torch.long)
    ok = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"Batch.last has shape \(2, 4, 8\); its first two dims must be input_ids' "
                       r"\(2, 5\)"):
        Batch(ids, ok, ok, {"last": torch.zeros(2, 4, 8)})


def test_target_info_reads_config_and_shared_weights():
    info = TargetInfo.from_path(specdec.bundled_model("tiny"))
    assert (info.hidden_size, info.vocab_size, info.num_layers) == (256, 4096, 4)
    assert tuple(info.lm_head_weight().shape) == (4096, 256)  # tied: the embedding
    with pytest.raises(KeyError, match="has no weight named nope"):
        info.weight("nope")


# ---------------------------------------------------------------- the loop: resume


@dataclass(frozen=True)
class _DropOptions:
    num_heads: int = 2
    feature_layer: int = -1


def _dropout_trainer_class():
    """skiphead with dropout on its features: the resumed run only matches if the RNG state is restored too."""
    from specdec_skiphead.trainer import SkipheadTrainer

    class DropoutSkiphead(SkipheadTrainer):
        method = "skiphead_dropout"
        calls = 0
        interrupt_at: int | None = None

        def loss(self, batch):
            if self.head.training:
                DropoutSkiphead.calls += 1
                if DropoutSkiphead.calls == self.interrupt_at:
                    raise KeyboardInterrupt
            batch.hidden[LAST] = F.dropout(batch.hidden[LAST], 0.2, self.head.training)
            return super().loss(batch)

    return DropoutSkiphead


def write_shards(out: Path, files: list[str], layer_ids: list[int], last_layer: bool, seq_len: int = 64) -> str:
    """Shards (specdec_tools.shards.ShardWriter, bfloat16) of the bundled tiny target over ``files``: windows of
    ``seq_len`` tokens, every third one cut shorter so batches need padding."""
    from specdec.loading import read_json_object
    from specdec_tools.shards import ShardWriter
    from specdec_tools.train_data import OnlineData

    tiny = specdec.bundled_model("tiny")
    data = OnlineData(tiny, files, seq_len=seq_len)
    keys = [str(i) for i in layer_ids] + ([LAST] if last_layer else [])
    writer = ShardWriter(out, target_path=tiny, target_config=read_json_object(Path(tiny) / "config.json", "config"),
                         layer_ids=layer_ids, last_layer=last_layer, dtype="bfloat16", hidden_size=256,
                         shard_tokens=2048)
    for i in range(len(data)):
        b = data.batch([i], keys, torch.device("cpu"))
        n = seq_len - 16 if i % 3 == 2 else seq_len
        writer.add(b.input_ids[0, :n], b.loss_mask[0, :n], {k: v[0, :n] for k, v in b.hidden.items()})
    writer.close()
    return str(out)


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    """Shards of the bundled tiny target over four stdlib files: layer 2 and the last hidden state."""
    return write_shards(tmp_path_factory.mktemp("shards"), TEXT_FILES, layer_ids=[2], last_layer=True)


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "model.safetensors"))


@needs_skiphead
def test_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(shard_dir, tmp_path):
    from specdec_tools.train_data import ShardData

    cls = _dropout_trainer_class()
    target = TargetInfo.from_path(specdec.bundled_model("tiny"))
    kw = dict(steps=10, batch_size=4, lr=3e-3, eval_every=4, save_every=3, eval_fraction=0.1, progress=False)

    full = train(build_trainer(cls, target), ShardData(shard_dir), tmp_path / "full", **kw)
    assert not (tmp_path / "full" / CHECKPOINT).exists()  # removed once the outputs are written

    cls.calls, cls.interrupt_at = 0, 8  # killed during step 8: the last checkpoint is step 6's
    with pytest.raises(KeyboardInterrupt):
        train(build_trainer(cls, target), ShardData(shard_dir), tmp_path / "cut", **kw)
    ckpt = torch.load(tmp_path / "cut" / CHECKPOINT, weights_only=False)
    assert ckpt["step"] == 6 and [e["step"] for e in ckpt["history"]] == [4]
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == [CHECKPOINT]  # no temporary file left

    with pytest.raises(ValueError, match=r"holds the checkpoint of an unfinished run \(checkpoint.pt\): pass "
                       r"--resume to continue it, or train into a new --out"):
        train(build_trainer(cls, target), ShardData(shard_dir), tmp_path / "cut", **kw)
    with pytest.raises(ValueError, match=r"was written by a run with steps=10, this run has steps=11; resume with "
                       "the same settings, or train into a new --out"):
        train(build_trainer(cls, target), ShardData(shard_dir), tmp_path / "cut", resume=True, **{**kw, "steps": 11})

    cls.interrupt_at = None
    resumed = train(build_trainer(cls, target), ShardData(shard_dir), tmp_path / "cut", resume=True, **kw)
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["training"]["resumed_from_step"] == 6
    assert [e["loss"] for e in resumed["eval_history"]] == [e["loss"] for e in full["eval_history"]]
    assert json.loads((tmp_path / "cut" / "metrics.json").read_text())["held_out"] == full["held_out"]


@needs_skiphead
def test_resume_without_checkpoint_starts_over_and_bad_settings_are_refused(shard_dir, tmp_path):
    from specdec_tools.train_data import ShardData

    trainer = build_trainer(registry.get_trainer_class("skiphead"), TargetInfo.from_path(specdec.bundled_model("tiny")))
    lines: list[str] = []
    metrics = train(trainer, ShardData(shard_dir), tmp_path, steps=2, batch_size=2, eval_every=2, resume=True,
                    progress=False, log=lines.append)
    assert metrics["training"]["resumed_from_step"] is None and lines[0].endswith("starting at step 0")
    assert lines[-1].startswith("specdec train: mean step time ")
    for kw, message in [({"steps": 0}, "steps=0 is invalid: it must be an int >= 1 (optimizer steps)."),
                        ({"lr": float("nan")}, "lr=nan is invalid: it must be a finite number > 0, e.g. 1e-3."),
                        ({"eval_fraction": 1.0}, "eval_fraction=1.0 is invalid: it must be in (0, 1), e.g. 0.05.")]:
        with pytest.raises(ValueError) as exc:
            train(trainer, ShardData(shard_dir), tmp_path / "x", **{"steps": 2, **kw})
        assert str(exc.value) == message
