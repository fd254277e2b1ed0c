"""lm-evaluation-harness's ``LM`` interface over a trained language-model run.

``HarnessLM(run=RUN_ID_OR_DIR)`` loads the run (:func:`harness.run.trained.load`) and its
text codec (:mod:`harness.evaluation.text`) and answers lm-eval's three requests:

* ``loglikelihood``: context and continuation are encoded together (lm-eval's
  ``TemplateLM`` splits them), the input is cut from the left to the model's context
  (``max_length``: the longest input it trained on, unless given) as lm-eval's ``HFLM``
  does, and requests are scored in batches (longest first, right-padded: the models are
  causal, so padding after a sequence never changes its scores). A continuation longer than
  the context cannot be scored and is a :class:`ContextError`.
* ``loglikelihood_rolling``: the document's tokens in lm-eval's rolling windows
  (``get_rolling_token_windows`` with ``max_seq_len=max_length``, ``context_len=1``, the
  ``<eod>`` token before the first: what precedes a document in training), each window
  scored like a ``loglikelihood`` request. On a corpus run these are exactly the
  ``windows`` protocol's windows, so the sum equals the run's own validation loss on the same
  text.
* ``generate_until``: greedy (or sampled with ``do_sample``/``temperature``, from a generator
  seeded by ``seed``) through the model's own decoding path (its cache when it has
  ``new_cache()``), stopping at an end token, at any of ``until`` (cut there) or after
  ``max_gen_toks``; the context is cut from the left to ``max_length - max_gen_toks + 1``
  tokens (the model reads the context and every new token but the last: at most
  ``max_length`` positions).

Importing this module registers the model with lm-eval as ``harness``.
"""

from __future__ import annotations

from typing import Any

import lm_eval.models  # noqa: F401  (lm-eval's own models first: its registry loads them only when empty)
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from harness.errors import ConfigError, HarnessError

DEFAULT_BATCH = 16
DEFAULT_GEN_TOKS = 256


class ContextError(HarnessError):
    """A request the model's context cannot hold."""


def not_a_language_model(trained: Any) -> HarnessError:
    return HarnessError(
        f"{trained.source} trained a {trained.task_kind} task in the {trained.info.format} "
        f"format: lm-eval scores text with a language model (the lm format: corpus_lm, "
        f"char_lm, or a symbol task read by a decoder-only model), and this run predicts "
        f"{'labels' if trained.info.format in ('classification', 'tagging') else 'through an encoder'}. "
        f"Evaluate it with its own task's metrics (its study, or `harness train`).")


def _int(value: Any, name: str, default: int) -> int:
    if value is None or value == "" or value == "auto":
        return default
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be an integer, got {value!r}.") from None
    if out < 1:
        raise ConfigError(f"{name} must be at least 1, got {out}.")
    return out


@register_model("harness")
class HarnessLM(TemplateLM):  # type: ignore[misc]
    """A trained harness run as an lm-eval model (see the module)."""

    def __init__(self, run: str | None = None, *, trained: Any = None, batch_size: Any = None,
                 max_length: Any = None, seed: Any = 0, device: str | None = None, **_: Any) -> None:
        super().__init__()
        from harness.evaluation.text import codec_of
        from harness.run.hub import load_any

        if trained is None:
            if not run:
                raise ConfigError("the harness model needs run=RUN_ID_OR_DIR (--model_args run=...).")
            trained = load_any(str(run))
        if trained.info.format != "lm":
            raise not_a_language_model(trained)
        self.trained = trained
        self.model = trained.model.eval()
        if device and device != "cpu":
            import torch

            if not device.startswith("cuda") or torch.cuda.is_available():  # lm-eval's default: cuda
                self.model.to(device)
        self.codec = codec_of(trained)
        self.batch_size = _int(batch_size, "batch_size", DEFAULT_BATCH)
        self.max_length = _int(max_length, "max_length", int(trained.info.max_length))
        try:
            self.seed = int(seed)
        except (TypeError, ValueError):
            raise ConfigError(f"seed must be an integer, got {seed!r}.") from None
        self.run = str(run or trained.source)

    # -- lm-eval's hooks ---------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.codec.prefix_id

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    @property
    def tokenizer_name(self) -> str:
        return self.codec.name

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.codec.encode(string)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.codec.decode(list(tokens))

    def get_model_info(self) -> dict[str, Any]:
        return {"model_name": f"harness:{self.run}", "model_max_length": self.max_length,
                "tokenizer": self.codec.name}

    # -- scoring ------------------------------------------------------------------------------
    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return super().loglikelihood(requests, disable_tqdm=True)  # type: ignore[no-any-return]

    def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False,
                              **kwargs: Any) -> list[tuple[float, bool]]:
        pairs = [(list(ctx), list(cont)) for _, ctx, cont in requests]
        results = self.score(pairs)
        for (key, _, _), result in zip(requests, results, strict=True):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """Log-likelihood of each continuation after its context (ids), and whether greedy
        decoding would produce it; inputs cut from the left to ``max_length``, batched."""
        import torch

        for _, cont in pairs:
            if not cont:
                raise ContextError("a request's continuation is empty: there is nothing to score.")
            if len(cont) > self.max_length:
                raise ContextError(
                    f"a continuation of {len(cont)} tokens is longer than the model's context "
                    f"({self.max_length} tokens, the longest input it trained on): it cannot be "
                    f"scored. Use a task with shorter answers, or train at a longer length.")
        order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
        out: list[tuple[float, bool]] = [(0.0, False)] * len(pairs)
        with torch.no_grad():
            for at in range(0, len(order), self.batch_size):
                chunk = order[at: at + self.batch_size]
                inputs, spans = [], []
                for i in chunk:
                    ctx, cont = pairs[i]
                    whole = (ctx + cont)[-(self.max_length + 1):]
                    inputs.append(whole[:-1])
                    spans.append((len(whole) - 1 - len(cont), cont))
                width = max(len(x) for x in inputs)
                tokens = torch.zeros(len(inputs), width, dtype=torch.long)
                padding = torch.ones(len(inputs), width, dtype=torch.bool)
                for row, x in enumerate(inputs):
                    tokens[row, : len(x)] = torch.tensor(x)
                    padding[row, : len(x)] = False
                logits = self._logits(tokens.to(self.device), padding.to(self.device))
                logp = torch.log_softmax(logits.float(), dim=-1).cpu()
                for row, (i, (start, cont)) in enumerate(zip(chunk, spans, strict=True)):
                    part = logp[row, start: start + len(cont)]
                    target = torch.tensor(cont)
                    total = float(part.double().gather(1, target[:, None]).sum())
                    greedy = bool((part.argmax(-1) == target).all())
                    out[i] = (total, greedy)
        return out

    def _logits(self, tokens: Any, padding: Any) -> Any:
        out = self.model(tokens, padding_mask=padding)
        return out[0] if isinstance(out, tuple) else out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        out: list[float] = []
        for request in requests:
            (text,) = request.args
            pairs = [make_disjoint_window(w) for w in get_rolling_token_windows(
                self.tok_encode(text), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            total = sum(ll for ll, _ in self.score([(list(c), list(p)) for c, p in pairs]))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    # -- generating ---------------------------------------------------------------------------
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        out = []
        for request in requests:
            context, kwargs = request.args
            text = self.continue_text(context, **dict(kwargs or {}))
            self.cache_hook.add_partial("generate_until", (context, kwargs), text)
            out.append(text)
        return out

    def continue_text(self, context: str, *, until: Any = None, max_gen_toks: Any = None,
                      do_sample: bool = False, temperature: Any = 0.0, **_: Any) -> str:
        """The text the model writes after ``context`` (see the module for the rules)."""
        import torch

        from harness.run.trained import continuation

        stops = [until] if isinstance(until, str) else list(until or [])
        limit = _int(max_gen_toks, "max_gen_toks", DEFAULT_GEN_TOKS)
        if limit >= self.max_length:
            raise ContextError(
                f"max_gen_toks {limit} leaves no room for a prompt in the model's context "
                f"({self.max_length} tokens): lower max_gen_toks in the task's generation_kwargs.")
        temp = float(temperature or 0.0) if do_sample else 0.0
        ids = self.tok_encode(context) or [self.prefix_id_for_generation()]
        ids = ids[-(self.max_length - limit + 1):]  # the last new token is never read
        generator = torch.Generator().manual_seed(self.seed)
        new: list[int] = []
        with torch.no_grad():
            for nxt in continuation(self.model, ids, temp, None, None, generator):
                if nxt in self.codec.stop_ids:
                    break
                new.append(nxt)
                text = self.tok_decode(new)
                if len(new) == limit or any(s and s in text for s in stops):
                    break
        text = self.tok_decode(new)
        for stop in stops:
            if stop:
                text = text.split(stop)[0]
        return text

    def prefix_id_for_generation(self) -> int:
        return int(self.codec.prefix_id)
