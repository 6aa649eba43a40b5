import re


def slugify(title: str) -> str:
    """Return a URL slug for ``title``: lowercase ASCII words joined by single hyphens."""
    words = re.findall(r"[a-z0-9]+", title.lower())
    return "-".join(words)
