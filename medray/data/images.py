"""Image files referenced by multiple-choice items: confined to the input folder, real images.

Checked when a dataset is prepared and again by every engine before it reads a file, so a
link such as `../../etc/passwd` or an absolute path never ends up in a request.
"""

from __future__ import annotations

from pathlib import Path

MAX_IMAGE_BYTES = 20 * 1024 * 1024
# Magic bytes -> media type (the formats the chat APIs accept).
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
          (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"))


class ImageError(ValueError):
    """An image path that escapes its root, is missing, too large or not an image."""


def media_type(head: bytes) -> str | None:
    for magic, media in _MAGIC:
        if head.startswith(magic):
            return media
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def check_image_bytes(data: bytes) -> str:
    """The media type of an image given as bytes (an image embedded in a Parquet table);
    ImageError when it is over MAX_IMAGE_BYTES or not PNG/JPEG/GIF/WebP by its magic bytes."""
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"image is {len(data)} bytes; at most {MAX_IMAGE_BYTES}")
    media = media_type(data[:16])
    if media is None:
        raise ImageError("image is not a PNG, JPEG, GIF or WebP file")
    return media


def image_name(data: bytes, media: str) -> str:
    """The file name an embedded image gets in a prepared folder: its content's hash, so the
    same image twice is one file and the name is the same on every run."""
    import hashlib

    suffix = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif",
              "image/webp": ".webp"}[media]
    return hashlib.sha256(data).hexdigest()[:20] + suffix


def confined_image(link: str | Path, root: str | Path, base: str | Path | None = None) -> Path:
    """The resolved image path (symlinks followed) if it lies inside `root`, exists, is at
    most MAX_IMAGE_BYTES and starts with PNG/JPEG/GIF/WebP magic bytes; else ImageError.
    A relative `link` is taken relative to `base` (default: `root`)."""
    root_path = Path(root).resolve()
    path = (Path(base or root) / link).resolve()
    if not path.is_relative_to(root_path):
        raise ImageError(f"image {str(link)!r} resolves to {path}, outside {root_path}")
    if not path.is_file():
        raise ImageError(f"image {str(link)!r} not found (looked at {path})")
    size = path.stat().st_size
    if size > MAX_IMAGE_BYTES:
        raise ImageError(f"image {str(link)!r} is {size} bytes; at most {MAX_IMAGE_BYTES}")
    with path.open("rb") as f:
        head = f.read(16)
    if media_type(head) is None:
        raise ImageError(f"image {str(link)!r} is not a PNG, JPEG, GIF or WebP file")
    return path
