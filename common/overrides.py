"""Hydra override strings (``key=value``, ``+key=value``, ``++key=value``, ``~key``): the one
place that reads their key and value, and that lays an arm's overrides over a job's."""


def override_key(override: str) -> str:
    """The dotted key an override sets, without Hydra's ``+``, ``++`` or ``~`` prefix."""
    return override.split("=", 1)[0].lstrip("+~")


def override_value(overrides: list[str], key: str, default: str | None = None) -> str | None:
    """The value the last override of ``key`` gives (Hydra applies the last one), else ``default``."""
    values = [item.split("=", 1)[1] for item in overrides if "=" in item and override_key(item) == key]
    return values[-1] if values else default


def not_set_by(base: list[str], extra: list[str]) -> list[str]:
    """``extra``'s overrides of keys ``base`` does not set: what a study arm adds to a job whose
    command line may already fix some of its keys (the command line wins)."""
    given = {override_key(item) for item in base}
    return [item for item in extra if override_key(item) not in given]
