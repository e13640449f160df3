"""Image files referenced by multiple-choice items: confined to the input folder, real images.

Checked when a dataset is prepared and again by every engine before it reads a file, so a
link such as `../../etc/passwd` or an absolute path never ends up in a request. Images that
arrive over HTTP as data URLs (Serve's /v1/mcq and chat routes) get the same checks, and a
full decode.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from pathlib import Path

MAX_IMAGE_BYTES = 20 * 1024 * 1024
# Pixels an image sent over HTTP may decode to (a small PNG can unpack to gigabytes).
MAX_IMAGE_PIXELS = 40_000_000
# The only image references the HTTP routes take: the image itself, never a URL to fetch.
DATA_URL = re.compile(r"^data:(image/(?:png|jpeg|gif|webp));base64,")
# Magic bytes -> media type (the formats the chat APIs accept).
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
          (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"))


class ImageError(ValueError):
    """An image path that escapes its root, is missing, too large or not an image."""


class ImageTooLarge(ImageError):
    """An image over the size cap (bytes, or pixels once decoded)."""


def media_type(head: bytes) -> str | None:
    for magic, media in _MAGIC:
        if head.startswith(magic):
            return media
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def check_image_bytes(data: bytes, max_bytes: int = MAX_IMAGE_BYTES) -> str:
    """The media type of an image given as bytes (an image embedded in a Parquet table);
    ImageError when it is over `max_bytes` or not PNG/JPEG/GIF/WebP by its magic bytes."""
    if len(data) > max_bytes:
        raise ImageTooLarge(f"image is {len(data)} bytes; at most {max_bytes}")
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


def confined_images(paths: Sequence[str], root: str | None) -> list[Path]:
    """An item's image paths, each checked by `confined_image` (inside `root`; with no root,
    inside its own folder)."""
    return [confined_image(Path(p).name if root is None else p,
                           Path(p).parent if root is None else root) for p in paths]


def decode_data_url(url: str, max_bytes: int = MAX_IMAGE_BYTES) -> bytes:
    """The image in a data URL, checked as an image file is (type by magic bytes matching
    the declared type, at most `max_bytes`) and decoded once in full (at most
    MAX_IMAGE_PIXELS); ImageError (ImageTooLarge for the caps) otherwise."""
    match = DATA_URL.match(url)
    if match is None:
        raise ImageError("not a data URL of a PNG, JPEG, GIF or WebP image "
                         "(data:image/png;base64,...); remote URLs are not fetched")
    encoded = url[match.end():]
    if len(encoded) // 4 * 3 > max_bytes + 2:  # before decoding: no large allocation
        raise ImageTooLarge(f"image is about {len(encoded) // 4 * 3} bytes; at most {max_bytes}")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("not valid base64") from None
    media = check_image_bytes(data, max_bytes)
    if media != match.group(1):
        raise ImageError(f"declared {match.group(1)} but the bytes are {media}")
    _check_decodes(data)
    return data


def _check_decodes(data: bytes) -> None:
    import io
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                width, height = img.size
                if width * height > MAX_IMAGE_PIXELS:
                    raise ImageTooLarge(f"image is {width}x{height} pixels; at most "
                                        f"{MAX_IMAGE_PIXELS} pixels")
                img.load()
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageTooLarge(f"image decodes to more than {MAX_IMAGE_PIXELS} pixels") from None
    except Exception as exc:  # noqa: BLE001 -- PIL raises many types for broken files
        raise ImageError(f"image does not decode ({type(exc).__name__})") from None
