"""A stand-in for the part of LMDeploy 0.18.0 that rlx's backend touches, so CPU tests can run it.

Every class and function named in ``REAL`` copies 0.18.0's signature (names, kinds, defaults,
async or not), its instance attributes and its dataclass/pydantic fields, and the behaviour rlx
depends on: ``generate`` takes only what ``preprocess`` made and yields the response in pieces
(the stop token last, on its own); sleeping blocks requests; ``wakeup`` ignores tags that are not
asleep; the single-GPU ``UniExecutor`` has no ``update_params`` (its base raises), and the model
agent rebuilds each tensor as ``func(*args)`` with ``args[6]`` set to its device.
``tests/test_lmdeploy_contract.py`` compares all of this with the real source, so the stand-in
cannot drift from the release it copies. What it cannot copy is a model: the "model" here is a rule
(next token = previous + 1 + a weight), enough to tell old weights from new ones.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import importlib.machinery
import io
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

# stand-in name -> the real module the backend reaches it through
REAL = {
    "pipeline": "lmdeploy",
    "GenerationConfig": "lmdeploy",
    "PytorchEngineConfig": "lmdeploy",
    "TurbomindEngineConfig": "lmdeploy",
    "Pipeline": "lmdeploy.pipeline",
    "_EventLoopThread": "lmdeploy.pipeline",
    "AsyncEngine": "lmdeploy.serve.core.async_engine",
    "GenOut": "lmdeploy.serve.core.async_engine",
    "Response": "lmdeploy.messages",
    "Tokenizer": "lmdeploy.tokenizer",
    "PreprocessedRequest": "lmdeploy.serve.core.async_engine",
    "Session": "lmdeploy.serve.managers.session_manager",
    "SessionManager": "lmdeploy.serve.managers.session_manager",
    "UpdateParamsRequest": "lmdeploy.serve.openai.protocol",
    "Engine": "lmdeploy.pytorch.engine.engine",
    "ExecutorBase": "lmdeploy.pytorch.engine.executor.base",
    "UniExecutor": "lmdeploy.pytorch.engine.executor.uni_executor",
    "BaseModelAgent": "lmdeploy.pytorch.engine.model_agent.agent",
    "Scheduler": "lmdeploy.pytorch.paging.scheduler",
    "BaseBlockManager": "lmdeploy.pytorch.paging.block_manager.base_block_manager",
    "BlockTrie": "lmdeploy.pytorch.paging.block_trie.trie",
    "serialize_state_dict": "lmdeploy.utils",
}

CALLS: list[tuple] = []  # what the engine was asked to do, in order (tests read it)
PIPELINES: list[Pipeline] = []  # every pipeline made, newest last
LEARNT: dict[tuple[int, ...], list[int]] = {}  # prompts the rule-model answers by heart (tests set them)
REQUESTS: list[tuple[float, list[int]]] = []  # when each generation started, and its input ids


@dataclass
class GenerationConfig:
    n: int = 1
    max_new_tokens: int = 512
    do_sample: bool = False
    top_p: float = 1.0
    top_k: int = 50
    min_p: float = 0.0
    temperature: float = 0.8
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    random_seed: int = None
    stop_words: list[str] = None
    bad_words: list[str] = None
    stop_token_ids: list[int] = None
    bad_token_ids: list[int] = None
    min_new_tokens: int = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logprobs: int = None
    logprob_start_len: int = -1
    include_stop_str_in_output: bool = False


@dataclass
class PytorchEngineConfig:
    dtype: str = "auto"
    tp: int = 1
    session_len: int = None
    max_batch_size: int = None
    cache_max_entry_count: float = 0.8
    max_prefill_token_num: int = 8192
    enable_prefix_caching: bool = False
    eager_mode: bool = False
    empty_init: bool = False
    logprobs_mode: str = None

    def __post_init__(self):
        assert self.dtype in ["auto", "float16", "bfloat16"]
        assert 0 < self.cache_max_entry_count < 1, "invalid cache_max_entry_count"


@dataclass
class TurbomindEngineConfig:
    dtype: str = "auto"
    tp: int = 1
    session_len: int | None = None
    max_batch_size: int = None
    cache_max_entry_count: float = 0.8
    enable_prefix_caching: bool = False


class UpdateParamsRequest(BaseModel):
    serialized_named_tensors: str | list[str] | dict
    load_format: str | None = None
    finished: bool = False


@dataclass
class Response:
    text: str
    generate_token_len: int
    input_token_len: int
    finish_reason: Literal["stop", "length", "error", "abort"] | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = None
    index: int = 0

    def extend(self, other: Response) -> Response:
        """0.18's merge of a response's pieces: text, ids and log-probs appended, the rest the later piece's."""
        self.text += other.text
        self.generate_token_len, self.input_token_len = other.generate_token_len, other.input_token_len
        self.finish_reason, self.index = other.finish_reason, other.index
        self.token_ids += other.token_ids or []
        if other.logprobs is not None:
            self.logprobs = (self.logprobs or []) + other.logprobs
        return self


@dataclasses.dataclass
class GenOut:
    response: str
    input_token_len: int
    generate_token_len: int
    finish_reason: Literal["stop", "length", "error", "abort"] | None = None
    token_ids: list[int] | None = None
    logprobs: list[dict[int, float]] | None = None

    def to_response(self, index: int = 0) -> Response:
        return Response(
            self.response, self.generate_token_len, self.input_token_len, self.finish_reason,
            list(self.token_ids or []), self.logprobs, index,
        )  # fmt: skip


class Tokenizer:
    """0.18's tokenizer of a model folder: the folder's HF tokenizer, whose special tokens it adds."""

    def __init__(self, model_path: str, trust_remote_code: bool = False):
        from transformers import AutoTokenizer

        self.model = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)

    def encode(self, s: str, add_bos: bool = True, add_special_tokens: bool = True, **kwargs):
        encoded = self.model.encode(s, add_special_tokens=add_special_tokens, **kwargs)
        return encoded[1:] if not add_bos and encoded[:1] == [self.model.bos_token_id] else encoded


@dataclasses.dataclass(slots=True)
class PreprocessedRequest:
    session: Session
    inputs: dict[str, Any]
    input_token_len: int
    gen_config: GenerationConfig
    adapter_name: str | None
    consumed: bool = False


class Session:
    def __init__(self, session_id: int, session_mgr: SessionManager, **kwargs):
        self.session_id = session_id
        self.epoch: int | None = None


class SessionManager:
    def __init__(self):
        self.sessions = {}

    def get(self, session_id: int | None = None, create_if_not_exists: bool = True, **kwargs) -> Session | None:
        session_id = len(self.sessions) if session_id is None else session_id
        return self.sessions.setdefault(session_id, Session(session_id, self, **kwargs))


class BaseModelAgent:
    """Holds the "weights": one number per name; level-2 sleep drops them, as LMDeploy's does."""

    def __init__(self):
        self._weights: dict[str, float] | None = {"bias": 0.0}

    async def sleep(self, level: int = 1):
        self._weights = {"bias": 0.0} if level == 1 else None

    def wakeup(self, tags: list[str] | None = None):
        if "weights" in (tags or ["weights"]) and self._weights is None:
            self._weights = {}  # rebuilt empty: the caller must load every weight

    def update_params(self, request: UpdateParamsRequest):
        """0.18's deserialization: base64 of a ForkingPickler list of ``(name, (func, args))``."""
        CALLS.append(("update_params", request.finished))
        if self._weights is None:
            raise RuntimeError("update_params while the weights are asleep (wake them first)")
        for name, (func, args) in ForkingPickler.loads(base64.b64decode(request.serialized_named_tensors)):
            args = list(args)
            args[6] = 0  # torch.cuda.current_device()
            self._weights[name] = float(func(*args).clone().float().sum())

    def _next_token(self, previous: int) -> int:
        return (previous + 1 + int(self._weights.get("bias", 0.0))) % 64


class ExecutorBase:
    def update_params(self, request: Any):
        """Update params."""
        raise NotImplementedError("Not Implemented.")


class UniExecutor(ExecutorBase):
    def __init__(self):
        self.model_agent = BaseModelAgent()

    async def sleep(self, level: int = 1):
        await self.model_agent.sleep(level)

    def wakeup(self, tags: list[str] | None = None):
        self.model_agent.wakeup(tags)


class BaseBlockManager:
    def __init__(self, num_gpu_blocks: int):
        self.num_gpu_blocks = num_gpu_blocks


class BlockTrie:
    """The prefix cache's trie: only what rlx asks of it (the real one is run in tests/test_lmdeploy_contract.py)."""

    def __init__(self):
        self.enabled = True

    def evict(self, max_num_blocks: int):
        CALLS.append(("evict", max_num_blocks))
        return 0


class Scheduler:
    def __init__(self):
        self.block_manager = BaseBlockManager(16)
        self.block_trie = BlockTrie()


class Engine:
    def __init__(self):
        self.executor = UniExecutor()
        self.scheduler = Scheduler()

    async def sleep(self, level: int = 1):
        CALLS.append(("sleep", level))
        await self.executor.sleep(level)

    def wakeup(self, tags: list[str] | None = None):
        CALLS.append(("wakeup", tags))
        self.executor.wakeup(tags)

    def update_params(self, request: Any):
        self.executor.update_params(request)

    def complete_weights_update(self):
        CALLS.append(("complete_weights_update",))


class AsyncEngine:
    def __init__(self, model_path: str, backend: Literal["turbomind", "pytorch"] = "turbomind", backend_config=None):
        self.tokenizer = Tokenizer(model_path) if (Path(model_path) / "tokenizer_config.json").is_file() else None
        self.engine = Engine()
        self.backend = backend
        self.backend_config = backend_config
        self.session_mgr = SessionManager()
        self.is_sleeping = False
        self.sleeping_tags: set[str] = set()

    async def sleep(self, level: int = 1):
        self.is_sleeping = True
        self.sleeping_tags = {"weights", "kv_cache"}
        await self.engine.sleep(level)

    def wakeup(self, tags: list[str] | None = None):
        tags = tags or list(self.sleeping_tags)
        if any(tag not in self.sleeping_tags for tag in tags):
            return  # 0.18 logs a warning and does nothing
        self.engine.wakeup(tags)
        self.sleeping_tags = self.sleeping_tags - set(tags)
        self.is_sleeping = bool(self.sleeping_tags)

    def complete_weights_update(self):
        self.engine.complete_weights_update()
        self.sleeping_tags.discard("weights")
        self.is_sleeping = bool(self.sleeping_tags)

    async def preprocess(
        self,
        messages,
        session_id: int | Session,
        gen_config: GenerationConfig | None = None,
        tools: list[object] | None = None,
        reasoning_effort: Literal["low", "medium", "high", "max"] | None = None,
        do_preprocess: bool = True,
        adapter_name: str | None = None,
        input_ids: list | None = None,
        enable_thinking: bool | None = None,
        chat_template_kwargs: dict | None = None,
        media_io_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        **kwargs,
    ) -> PreprocessedRequest:
        if (messages is not None) ^ (input_ids is None):
            raise ValueError("You must specify exactly one of messages or input_ids.")
        if not isinstance(session_id, Session):
            raise TypeError("the stand-in takes a Session")
        if messages is not None:  # text: with do_preprocess=False, 0.18 encodes it as it is (BOS and all)
            if do_preprocess or not isinstance(messages, str):
                raise NotImplementedError("the stand-in has no chat template: text with do_preprocess=False only")
            input_ids = self.tokenizer.encode(messages, add_bos=True)
        config = dataclasses.replace(gen_config or GenerationConfig())
        return PreprocessedRequest(session_id, {"input_ids": input_ids}, len(input_ids), config, adapter_name)

    async def generate(self, request: PreprocessedRequest, stream_response: bool = True):
        """0.18's pieces: the tokens before a stop token, then the stop token alone (with
        ``include_stop_str_in_output``), or an empty last piece when the length ran out."""
        if not isinstance(request, PreprocessedRequest):
            raise TypeError("generate requires a PreprocessedRequest returned by preprocess")
        if self.is_sleeping:
            raise RuntimeError("the real engine blocks requests while asleep: this one would hang")
        request.consumed = True
        config, prompt = request.gen_config, request.inputs["input_ids"]
        tokens, logprobs = self._sample(prompt, config)
        stopped = tokens[-1] in (config.stop_token_ids or [])
        body = len(tokens) - stopped
        yield GenOut("", len(prompt), body, None, tokens[:body], logprobs[:body] if config.logprobs else None)
        last = slice(body, None) if stopped and config.include_stop_str_in_output else slice(0)
        yield GenOut(
            "", len(prompt), len(tokens), "stop" if stopped else "length", tokens[last], logprobs[last] or None
        )

    def _sample(self, prompt: list[int], config: GenerationConfig) -> tuple[list[int], list[dict[int, float]]]:
        """The rule-model: each token follows the previous (or, for a prompt in ``LEARNT``, the reply
        learnt by heart); its log-prob map holds the sampled token first and then the top-1 (token 0), as
        the PyTorch engine's ``raw_logprobs`` do."""
        agent = self.engine.executor.model_agent
        REQUESTS.append((time.monotonic(), list(prompt)))
        if tuple(prompt) in LEARNT:
            tokens = LEARNT[tuple(prompt)][: config.max_new_tokens]
            return tokens, [{token: -0.25 * (i + 1), 0: -0.01} for i, token in enumerate(tokens)]
        tokens, previous = [], prompt[-1]
        while len(tokens) < config.max_new_tokens:
            previous = agent._next_token(previous)
            tokens.append(previous)
            if previous in (config.stop_token_ids or []) and len(tokens) >= (config.min_new_tokens or 0):
                break
        return tokens, [{token: -0.25 * (i + 1), 0: -0.01} for i, token in enumerate(tokens)]


class _EventLoopThread:
    def __init__(self, daemon=False):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=daemon)
        self._thread.start()

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()


class Pipeline:
    def __init__(
        self,
        model_path: str,
        backend_config: TurbomindEngineConfig | PytorchEngineConfig | None = None,
        chat_template_config=None,
        log_level: str = "WARNING",
        max_log_len: int | None = None,
        trust_remote_code: bool = False,
        speculative_config=None,
        allowed_media_domains: list[str] | None = None,
        **kwargs,
    ):
        backend = "turbomind" if isinstance(backend_config, TurbomindEngineConfig) else "pytorch"
        self.async_engine = AsyncEngine(model_path, backend, backend_config)
        self.internal_thread = _EventLoopThread(daemon=True)
        self.session_mgr = self.async_engine.session_mgr
        self._model_path = model_path

    def infer(
        self,
        prompts: list[str] | str | list[dict] | list[list[dict]] | tuple | list[tuple],
        gen_config: GenerationConfig | list[GenerationConfig] | None = None,
        do_preprocess: bool = True,
        adapter_name: str | None = None,
        use_tqdm: bool = False,
        **kwargs,
    ):
        """0.18's batch inference: every prompt a request of its own (with its own config when given a
        list), all in flight at once, each response its pieces merged (``Response.extend``), in order."""
        single = isinstance(prompts, str)
        prompts = [prompts] if single else prompts
        configs = gen_config if isinstance(gen_config, list) else [gen_config or GenerationConfig()] * len(prompts)
        engine = self.async_engine

        async def one(index: int, prompt, config: GenerationConfig) -> Response:
            session = self.session_mgr.get()
            request = await engine.preprocess(prompt, session, config, do_preprocess=do_preprocess, **kwargs)
            response = None
            async for out in engine.generate(request, stream_response=False):
                response = response.extend(out.to_response(index)) if response else out.to_response(index)
            return response

        async def every() -> list[Response]:
            return await asyncio.gather(*(one(i, p, c) for i, (p, c) in enumerate(zip(prompts, configs, strict=True))))

        outputs = asyncio.run_coroutine_threadsafe(every(), self.internal_thread.loop).result()
        return outputs[0] if single else outputs

    def close(self):
        self.internal_thread.close()


def pipeline(
    model_path: str,
    backend_config: TurbomindEngineConfig | PytorchEngineConfig | None = None,
    chat_template_config=None,
    log_level: str = "WARNING",
    max_log_len: int | None = None,
    trust_remote_code: bool = False,
    speculative_config=None,
    allowed_media_domains: list[str] | None = None,
    **kwargs,
):
    PIPELINES.append(Pipeline(model_path, backend_config, chat_template_config, log_level, max_log_len, **kwargs))
    return PIPELINES[-1]


def serialize_state_dict(state_dict: dict) -> str:
    """0.18's payload: each tensor as torch's ``reduce_tensor`` gives it (a CUDA IPC handle on a GPU)."""
    from torch.multiprocessing.reductions import reduce_tensor

    buffer = io.BytesIO()
    ForkingPickler(buffer).dump([(k, reduce_tensor(v)) for k, v in state_dict.items()])
    return base64.b64encode(buffer.getvalue()).decode("utf-8")


def install(monkeypatch) -> types.ModuleType:
    """Put the stand-in where ``import lmdeploy`` and ``from lmdeploy.serve.openai.protocol import
    UpdateParamsRequest`` find it, for one test."""
    CALLS.clear()
    LEARNT.clear()
    REQUESTS.clear()
    this = sys.modules[__name__]
    for dotted in sorted(set(REAL.values())):
        module = types.ModuleType(dotted)
        module.__spec__ = importlib.machinery.ModuleSpec(dotted, None)  # so importlib.util.find_spec sees it
        for name, where in REAL.items():
            if where == dotted:
                setattr(module, name, getattr(this, name))
        monkeypatch.setitem(sys.modules, dotted, module)
    for parent in ("lmdeploy.serve", "lmdeploy.serve.openai"):
        monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
    PIPELINES.clear()
    return sys.modules["lmdeploy"]
