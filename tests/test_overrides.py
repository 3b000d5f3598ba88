"""Override strings read in one place: keys without Hydra's prefixes, the last value wins, and
an arm's overrides never replace what the command line sets."""

from common.overrides import not_set_by, override_key, override_value


def test_keys_drop_hydras_prefixes_and_values_are_the_last_given() -> None:
    assert [override_key(o) for o in ["a.b=1", "+a.b=1", "++a.b=x=y", "~a.b", "~a.b=2"]] == ["a.b"] * 5
    overrides = ["model=tiny", "+optimizer.lr=1e-3", "model=nano", "~seed"]
    assert override_value(overrides, "model") == "nano"
    assert override_value(overrides, "optimizer.lr") == "1e-3"
    assert override_value(overrides, "seed", "1234") == "1234"  # deleted, not given a value
    assert override_value(["x=a=b"], "x") == "a=b"


def test_an_arms_overrides_are_added_only_where_the_job_sets_nothing() -> None:
    job = ["+technique=diloco", "optimizer.lr=2e-3"]
    arm = ["optimizer.lr=4e-3", "technique=diloco", "technique.diloco.sync_every=10", "~callbacks.pace"]
    assert not_set_by(job, arm) == ["technique.diloco.sync_every=10", "~callbacks.pace"]
