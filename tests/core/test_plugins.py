"""Tests for the plugin surface (docs/design.md section 2): entry-point discovery, lazy loading, the
SPECDEC_* variables, registration checks, the unknown-method error, create_proposer and the hooks.

Uses the two fixture distributions installed for real (`make install` / pip):
tests/fixtures/specdec-plugin-copycat (entry point `copycat`, method copycat) and
tests/fixtures/specdec-plugin-broken (entry point `broken`, fails on import).
"""

from __future__ import annotations

import importlib.metadata as importlib_metadata
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field

import pytest

import specdec
from specdec import hookspecs, registry

_INSTALLED = {ep.name for ep in importlib_metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}
needs_fixtures = pytest.mark.skipif(
    not {"copycat", "broken"} <= _INSTALLED,
    reason="fixture plugins not installed: pip install tests/fixtures/specdec-plugin-copycat "
    "tests/fixtures/specdec-plugin-broken",
)


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    """Each test starts from a registry that has loaded nothing; the original comes back afterwards."""
    monkeypatch.delenv("SPECDEC_PLUGINS", raising=False)
    monkeypatch.delenv("SPECDEC_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.setattr(registry, "_REGISTRY", registry._REGISTRY)  # restored on teardown
    registry._reset()
    yield


def _run_python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter (the SPECDEC_* variables are read once per process)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDEC_")}
    full_env.update(env)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# --- proposer classes used by the registration tests ---------------------------------------------


class GoodProposer(specdec.Proposer):
    method = "good_first"

    def propose(self, batch):
        return specdec.Drafts.empty(batch.batch_size)


class NotAProposer:
    method = "not_a_proposer"

    def propose(self, batch):
        return None


def _named(method):
    return type(f"Named_{method}", (GoodProposer,), {"method": method})


class NoMethodProposer(specdec.Proposer):
    def propose(self, batch):
        return specdec.Drafts.empty(batch.batch_size)


class AbstractProposer(specdec.Proposer):
    method = "abstract_one"


class DictOptionsProposer(GoodProposer):
    method = "dict_options"
    Options = dict


class InstanceOptionsProposer(GoodProposer):
    method = "instance_options"
    Options = specdec.NoOptions()


@dataclass
class _NoDefaultOptions:
    window: int
    depth: int = 2


class NoDefaultOptionsProposer(GoodProposer):
    method = "no_default_options"
    Options = _NoDefaultOptions


BAD_CLASSES = [
    pytest.param(NotAProposer, ["register() got", "NotAProposer", "expected a subclass of specdec.Proposer"],
                 id="not-a-proposer-subclass"),
    pytest.param("ngram", ["register() got 'ngram'", "expected a subclass of specdec.Proposer"], id="not-a-class"),
    pytest.param(NoMethodProposer, ["NoMethodProposer.method = None is invalid", "non-empty identifier"],
                 id="method-missing"),
    pytest.param(_named(""), ["Named_.method = '' is invalid", "non-empty identifier"], id="method-empty"),
    pytest.param(_named("my-method"), ["method = 'my-method' is invalid", "non-empty identifier", "'ngram'"],
                 id="method-not-identifier"),
    pytest.param(_named("3gram"), ["method = '3gram' is invalid"], id="method-starts-with-digit"),
    pytest.param(_named(7), ["method = 7 is invalid"], id="method-not-str"),
    pytest.param(AbstractProposer, ["AbstractProposer must implement propose(batch) -> Drafts"],
                 id="abstract-propose"),
    pytest.param(DictOptionsProposer, ["DictOptionsProposer.Options = <class 'dict'> must be a dataclass"],
                 id="options-not-dataclass"),
    pytest.param(InstanceOptionsProposer, ["InstanceOptionsProposer.Options = NoOptions()", "must be a dataclass"],
                 id="options-instance-not-class"),
    pytest.param(NoDefaultOptionsProposer, ["NoDefaultOptionsProposer.Options fields ['window'] need defaults"],
                 id="options-field-without-default"),
]


def _assert_left_nothing(plugin_name: str, *methods: str) -> None:
    reg = registry._REGISTRY
    assert reg.pm.get_plugin(plugin_name) is None, f"{plugin_name} is still registered with pluggy"
    for method in methods:
        assert method not in reg.methods
        assert all(info.plugin != plugin_name for info in reg.methods.values())


# --- discovery ------------------------------------------------------------------------------------


@needs_fixtures
def test_copycat_is_discovered_through_its_entry_point():
    info = specdec.available_methods()["copycat"]
    assert isinstance(info, specdec.MethodInfo)
    assert info.method == "copycat"
    assert info.plugin == "copycat"
    assert info.distribution == "specdec-plugin-copycat"
    assert info.version == importlib_metadata.version("specdec-plugin-copycat") == "0.1.0"
    assert info.status == "ok"
    assert info.error is None
    assert info.proposer_class.__module__ == "specdec_copycat"
    assert info.proposer_class.method == "copycat"


@needs_fixtures
def test_get_proposer_class_returns_the_registered_class():
    import specdec_copycat

    cls = specdec.get_proposer_class("copycat")
    assert cls is specdec_copycat.CopycatProposer
    assert issubclass(cls, specdec.Proposer)
    assert specdec.get_proposer_class("copycat") is cls  # cached, not reloaded


@needs_fixtures
def test_broken_plugin_is_reported_and_the_others_still_work():
    methods = specdec.available_methods()
    broken = methods["broken"]
    assert broken.status == "error"
    assert broken.plugin == "broken"
    assert broken.distribution == "specdec-plugin-broken"
    assert broken.version == "0.1.0"
    assert broken.proposer_class is None
    assert broken.error.startswith("ImportError: specdec_broken fails on purpose")
    assert methods["copycat"].status == "ok"

    errors = specdec.plugin_errors()
    assert errors["broken"] == broken.error
    assert "copycat" not in errors
    proposer = specdec.create_proposer({"method": "copycat", "num_speculative_tokens": 2})
    assert type(proposer).method == "copycat"


@needs_fixtures
def test_get_proposer_class_loads_only_the_plugin_it_needs():
    specdec.get_proposer_class("copycat")
    assert registry._REGISTRY.tried == {"copycat"}
    assert registry._REGISTRY.failures == {}
    assert registry._REGISTRY.pm.get_plugin("broken") is None


@needs_fixtures
def test_fresh_process_imports_no_plugin_until_asked_and_then_only_copycat():
    out = _run_python("""
        import sys

        attempted = []

        class Spy:  # sees every import attempt, even one that fails
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0].startswith("specdec_"):
                    attempted.append(name)
                return None

        sys.meta_path.insert(0, Spy())
        import specdec

        assert attempted == [], attempted
        specdec.get_proposer_class("copycat")
        print(sorted(set(attempted)))
    """)
    assert out.strip() == "['specdec_copycat']"


# --- SPECDEC_PLUGINS / SPECDEC_DISABLE_PLUGIN_AUTOLOAD --------------------------------------------


@needs_fixtures
def test_specdec_plugins_allowlist_keeps_only_the_named_entry_points(monkeypatch):
    monkeypatch.setenv("SPECDEC_PLUGINS", " copycat , ")
    methods = specdec.available_methods()
    assert "copycat" in methods
    assert "broken" not in methods
    assert specdec.plugin_errors() == {}
    assert set(registry._REGISTRY.entry_points) == {"copycat"}


@needs_fixtures
def test_specdec_plugins_allowlist_without_copycat_makes_it_unknown(monkeypatch):
    monkeypatch.setenv("SPECDEC_PLUGINS", "broken")
    assert "copycat" not in specdec.available_methods()
    with pytest.raises(specdec.UnknownMethodError, match="Unknown method 'copycat'") as exc:
        specdec.get_proposer_class("copycat")
    assert "broken (specdec-plugin-broken 0.1.0): ImportError" in str(exc.value)


@pytest.mark.parametrize("value", ["1", "true"])
def test_disable_autoload_loads_no_entry_point(monkeypatch, register_proposer, value):
    monkeypatch.setenv("SPECDEC_DISABLE_PLUGIN_AUTOLOAD", value)
    assert specdec.available_methods() == {}
    assert specdec.plugin_errors() == {}
    with pytest.raises(specdec.UnknownMethodError, match="Installed: none"):
        specdec.get_proposer_class("copycat")
    # embedders and tests still register by hand
    register_proposer(GoodProposer, name="by-hand")
    assert list(specdec.available_methods()) == ["good_first"]
    assert specdec.available_methods()["good_first"].plugin == "by-hand"
    assert specdec.available_methods()["good_first"].distribution is None


@needs_fixtures
def test_disable_autoload_zero_means_enabled(monkeypatch):
    monkeypatch.setenv("SPECDEC_DISABLE_PLUGIN_AUTOLOAD", "0")
    assert "copycat" in specdec.available_methods()


@needs_fixtures
def test_disable_autoload_in_a_fresh_process():
    code = """
        import specdec
        print(sorted(specdec.available_methods()), sorted(specdec.plugin_errors()))
    """
    assert _run_python(code, SPECDEC_DISABLE_PLUGIN_AUTOLOAD="1", SPECDEC_PLUGINS="copycat").strip() == "[] []"


# --- registration checks --------------------------------------------------------------------------


@pytest.mark.parametrize(("bad", "fragments"), BAD_CLASSES)
def test_invalid_proposer_class_is_rejected_and_leaves_nothing(register_proposer, bad, fragments):
    with pytest.raises(specdec.PluginValidationError) as exc:
        register_proposer(GoodProposer, bad, name="bad-plugin")
    assert type(exc.value) is specdec.PluginValidationError
    assert isinstance(exc.value, TypeError)
    assert exc.value.plugin == "bad-plugin"
    message = str(exc.value)
    assert message.startswith("Plugin 'bad-plugin': ")
    for fragment in fragments:
        assert fragment in message
    _assert_left_nothing("bad-plugin", "good_first")
    # the name is free again: nothing half-registered is in the way
    register_proposer(GoodProposer, name="bad-plugin")
    assert specdec.get_proposer_class("good_first") is GoodProposer


def test_options_field_set_in_post_init_needs_no_default(register_proposer):
    @dataclass
    class DerivedOptions:
        window: int = 3
        span: int = field(init=False)

        def __post_init__(self):
            self.span = 2 * self.window

    register_proposer(type("Derived", (GoodProposer,), {"method": "derived", "Options": DerivedOptions}))
    assert specdec.get_proposer_class("derived").Options is DerivedOptions


def test_duplicate_method_names_the_plugin_that_has_it(register_proposer):
    first = _named("dup_method")
    second = type("SecondDup", (GoodProposer,), {"method": "dup_method"})
    register_proposer(first, name="first-plugin")
    with pytest.raises(specdec.PluginValidationError) as exc:
        register_proposer(GoodProposer, second, name="second-plugin")
    assert exc.value.plugin == "second-plugin"
    assert str(exc.value) == (
        "Plugin 'second-plugin': method 'dup_method' of SecondDup is already registered by plugin "
        "'first-plugin'; pick another name or uninstall one of the two plugins."
    )
    _assert_left_nothing("second-plugin", "good_first")
    assert specdec.get_proposer_class("dup_method") is first  # the first one is untouched


def test_one_plugin_registering_a_method_twice_is_rejected(register_proposer):
    with pytest.raises(specdec.PluginValidationError, match="already registered by plugin 'twice'"):
        register_proposer(GoodProposer, GoodProposer, name="twice")
    _assert_left_nothing("twice", "good_first")


@needs_fixtures
def test_method_taken_by_an_installed_plugin_names_it(register_proposer):
    specdec.get_proposer_class("copycat")
    with pytest.raises(specdec.PluginValidationError, match="already registered by plugin 'copycat'"):
        register_proposer(_named("copycat"), name="copycat-clone")
    _assert_left_nothing("copycat-clone")
    assert specdec.get_proposer_class("copycat").__module__ == "specdec_copycat"


@needs_fixtures
def test_entry_point_plugin_that_fails_to_register_is_reported(register_proposer):
    register_proposer(_named("copycat"), name="shadow")  # takes the name before copycat loads
    errors = specdec.plugin_errors()
    assert "PluginValidationError: Plugin 'copycat': method 'copycat'" in errors["copycat"]
    assert "already registered by plugin 'shadow'" in errors["copycat"]
    info = specdec.available_methods()["copycat"]
    assert (info.plugin, info.status) == ("shadow", "ok")


class _MisspelledHookPlugin:
    @specdec.hookimpl
    def specdec_register_proposers(self, register):
        register(GoodProposer)

    @specdec.hookimpl
    def specdec_register_proposer(self, register):  # missing "s"
        register(GoodProposer)


class _WrongArgumentPlugin:
    @specdec.hookimpl
    def specdec_register_proposers(self, registrar):
        registrar(GoodProposer)


def test_misspelled_hook_name_is_rejected():
    with pytest.raises(specdec.PluginValidationError) as exc:
        specdec.register_plugin(_MisspelledHookPlugin(), name="typo-plugin")
    assert exc.value.plugin == "typo-plugin"
    message = str(exc.value)
    assert message.startswith("Plugin 'typo-plugin': ")
    assert "unknown hook 'specdec_register_proposer'" in message
    assert "specdec.hookspecs" in message
    _assert_left_nothing("typo-plugin", "good_first")


def test_hookimpl_argument_not_in_the_spec_is_rejected():
    with pytest.raises(specdec.PluginValidationError) as exc:
        specdec.register_plugin(_WrongArgumentPlugin(), name="wrong-arg")
    assert exc.value.plugin == "wrong-arg"
    message = str(exc.value)
    assert message.startswith("Plugin 'wrong-arg': ")
    assert "registrar" in message and "specdec_register_proposers" in message
    assert "specdec.hookspecs" in message
    _assert_left_nothing("wrong-arg", "good_first")


def test_plugin_name_registered_twice_is_rejected(register_proposer):
    register_proposer(GoodProposer, name="same-name")
    with pytest.raises(specdec.PluginValidationError, match="Plugin 'same-name': Plugin name already registered"):
        register_proposer(_named("other_method"), name="same-name")
    assert "other_method" not in registry._REGISTRY.methods
    assert specdec.get_proposer_class("good_first") is GoodProposer


def test_exception_inside_the_hook_propagates_and_rolls_back():
    class Exploding:
        @specdec.hookimpl
        def specdec_register_proposers(self, register):
            register(GoodProposer)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        specdec.register_plugin(Exploding(), name="exploding")
    _assert_left_nothing("exploding", "good_first")


def test_register_and_unregister_by_hand():
    class Plugin:
        @specdec.hookimpl
        def specdec_register_proposers(self, register):
            register(GoodProposer)

    assert specdec.register_plugin(Plugin(), name="manual") == "manual"
    assert specdec.available_methods()["good_first"].plugin == "manual"
    specdec.unregister_plugin("manual")
    _assert_left_nothing("manual", "good_first")
    with pytest.raises(specdec.UnknownMethodError):
        specdec.get_proposer_class("good_first")


# --- unknown method -------------------------------------------------------------------------------


@needs_fixtures
def test_unknown_method_error_names_method_installed_and_pip_install(register_proposer):
    register_proposer(GoodProposer)
    with pytest.raises(specdec.UnknownMethodError) as exc:
        specdec.get_proposer_class("copycta")
    assert isinstance(exc.value, ValueError)
    message = str(exc.value)
    assert message.startswith("Unknown method 'copycta'. Installed: ")
    installed = message.split("Installed: ", 1)[1].split(".", 1)[0].split(", ")
    assert {"copycat", "good_first"} <= set(installed)
    assert installed == sorted(installed)
    assert "pip install specdec-plugin-<name>" in message
    assert "pip install specdec-plugin-copycta" in message
    assert "Plugins that failed to load: broken (specdec-plugin-broken 0.1.0): ImportError: " in message


@pytest.mark.parametrize("method", ["", None, 3])
def test_invalid_method_value_is_an_unknown_method_error(method):
    with pytest.raises(specdec.UnknownMethodError, match=f"method={method!r} is invalid"):
        specdec.get_proposer_class(method)


# --- create_proposer ------------------------------------------------------------------------------


@needs_fixtures
def test_create_proposer_from_dict():
    target = object()
    proposer = specdec.create_proposer(
        {"method": "copycat", "num_speculative_tokens": 3, "min_history": 4}, target=target
    )
    assert type(proposer) is specdec.get_proposer_class("copycat")
    assert isinstance(proposer.config, specdec.SpeculativeConfig)
    assert proposer.config.to_dict()["min_history"] == 4
    assert proposer.options.min_history == 4
    assert proposer.num_speculative_tokens == 3
    assert proposer.target is target


@needs_fixtures
def test_create_proposer_from_config():
    config = specdec.SpeculativeConfig(method="copycat", num_speculative_tokens=2)
    proposer = specdec.create_proposer(config)
    assert proposer.config is config
    assert proposer.options is config.options
    assert proposer.target is None
    assert proposer.num_speculative_tokens == 2


def test_create_proposer_unknown_method_and_missing_method():
    with pytest.raises(specdec.UnknownMethodError, match="Unknown method 'nope'"):
        specdec.create_proposer({"method": "nope", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="has no 'method' key"):
        specdec.create_proposer({"num_speculative_tokens": 2})


# --- hooks: every hookspec has a test that calls it -----------------------------------------------

HOOKSPECS = {"specdec_register_proposers", "specdec_register_trainers"}


def test_every_hookspec_has_a_test():
    specs = {name for name, obj in vars(hookspecs).items() if callable(obj) and hasattr(obj, "specdec_spec")}
    tested = {name.removeprefix("test_hook_") for name in globals() if name.startswith("test_hook_")}
    assert specs == HOOKSPECS, "a hookspec was added or removed: list it here and write test_hook_<name>"
    assert tested == specs


def test_hook_specdec_register_proposers(monkeypatch):
    monkeypatch.setenv("SPECDEC_DISABLE_PLUGIN_AUTOLOAD", "1")  # only this test's plugin answers the hook
    calls = []

    class Plugin:
        @specdec.hookimpl
        def specdec_register_proposers(self, register):
            calls.append(register)
            register(GoodProposer)
            register(_named("good_second"))

    specdec.register_plugin(Plugin(), name="hook-test")
    try:
        assert len(calls) == 1 and callable(calls[0])
        assert specdec.get_proposer_class("good_first") is GoodProposer
        assert specdec.get_proposer_class("good_second").method == "good_second"
        specdec.available_methods()
        assert len(calls) == 1  # called once, when the plugin is loaded

        # the spec as pluggy sees it: callable with register=..., returns nothing
        seen = []
        assert registry._REGISTRY.pm.hook.specdec_register_proposers(register=seen.append) == []
        assert [cls.method for cls in seen] == ["good_first", "good_second"]
    finally:
        specdec.unregister_plugin("hook-test")


def test_hook_specdec_register_trainers(monkeypatch):
    """Called once per plugin, on first demand for trainers (not when the plugin loads); more in test_train.py."""
    from specdec_tools.train import Trainer

    monkeypatch.setenv("SPECDEC_DISABLE_PLUGIN_AUTOLOAD", "1")
    calls = []

    class HookTrainer(Trainer):
        method = "hook_trained"
        build_head = loss = acceptance = save = lambda self, *a: None

    class Plugin:
        @specdec.hookimpl
        def specdec_register_trainers(self, register):
            calls.append(register)
            register(HookTrainer)

    specdec.register_plugin(Plugin(), name="trainer-hook-test")
    try:
        assert calls == []  # registering the plugin does not ask for its trainers
        assert registry.get_trainer_class("hook_trained") is HookTrainer
        registry.available_trainers()
        assert len(calls) == 1 and callable(calls[0])
        seen = []
        assert registry._REGISTRY.pm.hook.specdec_register_trainers(register=seen.append) == []
        assert seen == [HookTrainer]
    finally:
        specdec.unregister_plugin("trainer-hook-test")
    assert "hook_trained" not in registry.available_trainers()


@needs_fixtures
def test_installed_plugin_implements_the_register_hook():
    import specdec_copycat

    seen = []
    specdec_copycat.specdec_register_proposers(register=seen.append)
    assert seen == [specdec_copycat.CopycatProposer]
