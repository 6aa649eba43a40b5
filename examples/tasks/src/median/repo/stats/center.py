def mean(values):
    """Arithmetic mean of a non-empty list."""
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)


def median(values):
    """Middle value of a list."""
    return values[len(values) // 2]
