"""Image import for sandbox nodes (OCI layouts / docker-archive tars -> rootfs bundles, images.json)."""

from lego_rl.images.importer import (
    ImageOutcome,
    ImportReport,
    images_of_tasks,
    import_images,
    load_images_json,
)
from lego_rl.images.sources import ImportFailure, find_source

__all__ = [
    "ImageOutcome",
    "ImportFailure",
    "ImportReport",
    "find_source",
    "images_of_tasks",
    "import_images",
    "load_images_json",
]
