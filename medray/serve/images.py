"""Images in requests to a vision-language model: each data URL checked as the loader checks
an image file (medray.data.images), and /v1/mcq's rendered prompt sent with its images.

vLLM's completions route takes no images, so /v1/mcq asks the chat route with a template
that passes the prompt through unchanged: the prompt is the one the offline vLLM engine
reads (medray.prompts.text.prompt_text, image tokens where the model's chat template puts
them), and vLLM's processor expands each image token into the image's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from medray.data.images import ImageError, ImageTooLarge, decode_data_url
from medray.engines.base import Generation
from medray.serve.errors import APIError

# The request's own text, as is (content parts or a string); image parts add nothing here,
# the prompt's text already holds their tokens.
PASSTHROUGH_TEMPLATE = (
    "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}"
    "{% endif %}{% endfor %}{% endif %}{% endfor %}"
)


def check_images(urls: Sequence[tuple[str, str]], model: str, takes_images: bool,
                 max_bytes: int, status: int) -> None:
    """Every (where, data URL) is a real image under the caps; a 4xx naming it otherwise
    (413 over a cap, `status` for anything else); any image for a text-only model is a 400."""
    if urls and not takes_images:
        raise APIError(400, "invalid_request_error", f"{urls[0][0]}: model {model!r} is a "
                       "text-only model; it takes no images", urls[0][0])
    for where, url in urls:
        try:
            decode_data_url(url, max_bytes)
        except ImageTooLarge as err:
            raise APIError(413, "request_too_large", f"{where}: {err}", where) from None
        except ImageError as err:
            raise APIError(status, "invalid_request_error", f"{where}: {err}", where) from None


def image_chat_request(model: str, text: str, urls: Sequence[str], max_tokens: int) -> Any:
    """A greedy chat request that reads exactly `text` (with the tokenizer's special tokens,
    as a text prompt is read) and carries the images."""
    from ray.serve.llm.openai_api_models import ChatCompletionRequest

    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return ChatCompletionRequest(
        model=model, messages=[{"role": "user", "content": [*parts,
                                                            {"type": "text", "text": text}]}],
        chat_template=PASSTHROUGH_TEMPLATE, add_special_tokens=True, max_tokens=max_tokens,
        temperature=0.0, logprobs=True)


def chat_generation(response: Any) -> Generation:
    """The first choice of a chat response as a Generation (text, its log-probs, the
    prompt's tokens with the images' as vLLM counted them)."""
    choice = response.choices[0]
    content = (choice.logprobs.content if choice.logprobs else None) or []
    text = choice.message.content or ""
    return Generation(text=text, token_ids=[], logprobs=[float(c.logprob) for c in content],
                      prompt_tokens=int(response.usage.prompt_tokens), raw=text)
