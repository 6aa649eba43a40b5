_UNITS = {"h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> int:
    """Seconds in a duration such as ``"90s"`` or ``"2h"``."""
    if len(text) < 2 or text[-1] not in _UNITS or not text[:-1].isdigit():
        raise ValueError(f"not a duration: {text!r}")
    return int(text[:-1]) * _UNITS[text[-1]]
