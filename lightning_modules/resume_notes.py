"""What a resumed run changes: one line per setting that differs from the checkpoint's run.

The learning rate and its schedule, the other optimizer settings and the token budget may
change on resume; the training module applies them and logs these lines. What may not
change is refused before the run starts (``launch/resume.py``).
"""

from typing import Any


def resume_notes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """One line per setting that changed since the checkpoint and is applied from now on."""
    notes = []
    for section in ("optimizer", "lr_schedule"):
        for field, now in current[section].items():
            if field == "kind":  # checked by check_resume: another kind is refused
                continue
            before = saved.get(section, {}).get(field)
            if before != now:
                notes.append(f"resuming with {section}.{field}={now} (the checkpoint's run had {before})")
    if saved.get("token_budget") != current["token_budget"]:
        notes.append(
            f"resuming with token_budget={current['token_budget']} (the checkpoint's run had {saved.get('token_budget')})"
        )
    return notes
