"""report.html: the Markdown report rendered once, with its PNG plots inlined (base64), so
the one file can be opened, mailed or attached anywhere."""

from __future__ import annotations

import base64
import html
import re

STYLE = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;
line-height:1.45;color:#222}table{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.9rem}
th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f3f3}img{max-width:100%}code{background:#f5f5f5;padding:0 .2rem}"""


def to_html(markdown_text: str, images: dict[str, bytes], title: str) -> str:
    """Markdown (tables extension) -> a standalone page; `![..](name.png)` whose name is a
    key of `images` becomes a data: URI."""
    import markdown

    body = markdown.markdown(markdown_text, extensions=["tables"], output_format="html")

    def inline(match: re.Match[str]) -> str:
        name = html.unescape(match.group(1))
        if name not in images:
            return match.group(0)
        data = base64.b64encode(images[name]).decode("ascii")
        return f'src="data:image/png;base64,{data}"'

    body = re.sub(r'src="([^"]+\.png)"', inline, body)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
            f"<body>\n{body}\n</body></html>\n")
