"""Descriptive statistics for plain lists."""

from stats.center import mean, median

__all__ = ["mean", "median"]
