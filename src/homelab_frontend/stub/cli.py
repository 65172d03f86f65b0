"""`homelab-frontend stub ...` / `python -m homelab_frontend.stub ...`: run one stub upstream.

Prints `listening on http://HOST:PORT` (flushed) once the socket is bound, so a parent process
can start it with `--port 0` and read the port back; runs until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from .server import FLAVOURS, StubServer
from .state import StubConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--flavour", choices=sorted(FLAVOURS), default="vllm", help="upstream to imitate")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument(
        "--model",
        dest="models",
        action="append",
        metavar="NAME",
        help="served model id (repeatable); default depends on the flavour",
    )
    parser.add_argument(
        "--reasoning", action="store_true", help="emit reasoning first, like --reasoning-parser deepseek_r1"
    )
    parser.add_argument(
        "--reasoning-field",
        choices=["reasoning", "reasoning_content", "both"],
        default="reasoning",
        help="delta key for reasoning: vLLM>=0.16 'reasoning'; 'both' like vLLM 0.11-0.15",
    )
    parser.add_argument("--token-delay-ms", type=int, default=0, help="delay before each generated token")
    parser.add_argument("--max-model-len", type=int, default=4096, help="the context length it reports and enforces")
    parser.add_argument("--log", metavar="FILE", help="event log, truncated at start, one line per event")
    parser.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/*")
    parser.add_argument("--agent", action="store_true", help="scripted agent: call a tool, then report its result")
    parser.add_argument("--prefix-cache-tokens", type=int, default=0, metavar="N",
                        help="model a prefix (KV) cache holding N prompt tokens (0: none); vLLM flavour "
                             "reports usage.prompt_tokens_details.cached_tokens")
    parser.add_argument("--prefix-block", type=int, default=16, metavar="N", help="cache block size in tokens")
    parser.add_argument("--prefill-us-per-token", type=int, default=0, metavar="US",
                        help="time to first token grows by US microseconds per uncached prompt token")

    parser.add_argument("--start-delay-s", type=float, default=0.0, metavar="S",
                        help="load time before serving: vLLM binds its port only after it, llama.cpp "
                             "binds at once and answers 503 'Loading model' meanwhile")
    parser.add_argument("--exit-at-start", type=int, default=None, metavar="STATUS",
                        help="print a load error and exit with STATUS instead of serving")
    parser.add_argument("--exit-at-start-file", metavar="FILE",
                        help="like --exit-at-start, with the status read from FILE, only while FILE exists "
                             "(a test makes the next start fail on demand)")
    parser.add_argument("--end-of-turn-id", type=int, default=None, metavar="ID",
                        help="vLLM: stop_reason of an answer that ends on its own (a generation-config stop "
                             "token, as Gemma's 106); default null, as for R1's tokenizer EOS")
    parser.add_argument("--legacy-context-errors", action="store_true",
                        help="vLLM < 0.17: refuse prompt + max_tokens over the context instead of fitting "
                             "max_tokens to the room left (vLLM 0.32)")
    parser.add_argument("--sleep-delay-s", type=float, default=0.1, help="vLLM: time POST /sleep takes")
    parser.add_argument("--wake-delay-s", type=float, default=0.3, help="vLLM: time POST /wake_up takes")
    parser.add_argument("--no-rerank", action="store_true",
                        help="llama.cpp: started without --reranking, /rerank answers its 501")
    parser.add_argument("--request-path", default="", help="whisper.cpp: prefix of every route (its --request-path)")
    parser.add_argument("--inference-path", default="/inference",
                        help="whisper.cpp: the transcription route (its --inference-path)")
    parser.add_argument("--upload-read-ms", type=int, default=0, metavar="MS",
                        help="read every multipart upload slowly: wait MS after each 64 KiB")
    parser.add_argument("--no-fim", action="store_true",
                        help="llama.cpp: the model has no FIM tokens, /infill answers 501 (as Gemma 3 does)")


def config_from_args(args: argparse.Namespace) -> StubConfig:
    return StubConfig(
        flavour=args.flavour,
        host=args.host,
        port=args.port,
        models=tuple(args.models or ()),
        reasoning=args.reasoning,
        reasoning_field=args.reasoning_field,
        token_delay_ms=args.token_delay_ms,
        max_model_len=args.max_model_len,
        log=args.log,
        api_key=args.api_key,
        agent=args.agent,
        prefix_cache_tokens=args.prefix_cache_tokens,
        prefix_block=args.prefix_block,
        prefill_us_per_token=args.prefill_us_per_token,
        start_delay_s=args.start_delay_s,
        sleep_delay_s=args.sleep_delay_s,
        wake_delay_s=args.wake_delay_s,
        end_of_turn_id=args.end_of_turn_id,
        legacy_context_errors=args.legacy_context_errors,
        fim=not args.no_fim,
        reranking=not args.no_rerank,
        request_path=args.request_path,
        inference_path=args.inference_path,
        upload_read_ms=args.upload_read_ms,
    )


def _exit_at_start(args: argparse.Namespace) -> int | None:
    """The status to fail with at start, if this start is to fail (None: serve)."""
    if args.exit_at_start is not None:
        return args.exit_at_start
    path = args.exit_at_start_file
    if path:
        try:
            with open(path) as f:
                return int(f.read().strip() or "1")
        except FileNotFoundError:
            return None
        except ValueError:
            return 1
    return None


async def serve(config: StubConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stub = StubServer(config)
    if config.flavour != "llamacpp" and config.start_delay_s > 0:
        # vLLM loads the model before its HTTP server binds the port
        print(f"loading model for {config.start_delay_s:g} s", flush=True)
        try:
            await asyncio.wait_for(stop.wait(), config.start_delay_s)
            return
        except TimeoutError:
            pass
    async with stub:
        print(f"listening on {stub.url}", flush=True)
        await stop.wait()


def run(args: argparse.Namespace) -> int:
    status = _exit_at_start(args)
    if status is not None:
        print("error: failed to load model (the stub was told to fail at start)", file=sys.stderr, flush=True)
        return status
    config = config_from_args(args)
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(serve(config))
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m homelab_frontend.stub", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
