"""Parsing and formatting of durations."""

from timefmt.duration import parse_duration

__all__ = ["parse_duration"]
