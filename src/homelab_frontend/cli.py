"""homelab-frontend serve | check | usage | demo | stub | config-reference"""

from __future__ import annotations

import argparse
import os
import sys

from . import config as cfgmod


def _load(path: str) -> cfgmod.Config | None:
    """The config, or None after printing one line per problem."""
    try:
        return cfgmod.load(path)
    except cfgmod.ConfigError as err:
        for p in err.problems:
            print(p, file=sys.stderr)
        return None


def _cmd_check(args: argparse.Namespace) -> int:
    """Exit 0: `serve` runs it. 1: `serve` runs it, but a warning says it is probably not what was
    meant. 2: `serve` refuses it (the file, or an environment variable it names)."""
    cfg = _load(args.config)
    if cfg is None:
        return 2
    problems = cfgmod.environment_problems(cfg)  # the same question `serve` asks at start
    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        return 2
    warnings = cfgmod.warnings(cfg)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"config {'OK' if not warnings else 'usable, with warnings'}: listen {cfg.listen.host}:{cfg.listen.port}")
    print("backends:")
    for name, b in cfg.backends.items():
        print(f"  {name:<16} {b.kind or 'auto':<8} slots={b.slots:<3} queue={b.queue.depth}/{b.queue.timeout_s:g}s  {b.url}")
    print("models:")
    for name, m in cfg.models.items():
        up = m.upstream_model or name
        policy = ""
        if len(m.backend_names()) > 1:
            policy = f", session affinity (wait <= {m.affinity_max_wait_s:g}s)" if m.affinity else ", most free slots"
        if m.fallback:
            policy += f"; all down: {m.fallback}"
        print(f"  {name:<28} -> {', '.join(m.backend_names())}  (upstream model {up}{policy})")
    if cfg.aliases:
        print("aliases:")
        for pattern, target in cfg.aliases.items():
            print(f"  {pattern:<28} -> {target}")
    _print_resource_plan(cfg)
    return 1 if warnings else 0


def _print_resource_plan(cfg: cfgmod.Config) -> None:
    """Managed backends: what each uses of `resources`, and which cannot run at the same time."""
    managed = {n: b.run for n, b in cfg.backends.items() if b.run is not None}
    if not managed:
        return
    print("resources:" if cfg.resources else "resources: (none declared: managed backends never wait for room)")
    for r, total in cfg.resources.items():
        users = ", ".join(f"{n} {run.uses[r]:g}" for n, run in managed.items() if r in run.uses)
        print(f"  {r:<16} {total:g}  (used by: {users or 'nobody'})")
    print(f"managed backends (started on demand, swapped by policy {cfg.lifecycle.policy}"
          + (f", swap after {cfg.lifecycle.swap_after_s:g} s" if cfg.lifecycle.policy == "batch" else "") + "):")
    for n, run in managed.items():
        uses = " ".join(f"{r}={v:g}" for r, v in run.uses.items()) or "nothing"
        ttl = f"idle_ttl {run.idle_ttl_s:g}s" if run.idle_ttl_s else "no idle stop"
        print(f"  {n:<16} uses {uses:<14} {ttl}, unload {run.unload}, start_timeout {run.start_timeout_s:g}s"
              + (", preload" if run.preload else "") + f"  $ {' '.join(run.argv())}")
    names = list(managed)
    clashes = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ua, ub = managed[a].uses, managed[b].uses
            over = [f"{r}: {ua[r] + ub[r]:g} > {cfg.resources[r]:g}"
                    for r in ua if r in ub and ua[r] + ub[r] > cfg.resources[r] + 1e-9]
            if over:
                clashes.append(f"{a} + {b} ({'; '.join(over)})")
    if clashes:
        print("  cannot run together (one is stopped to start the other):")
        for c in clashes:
            print(f"    {c}")
    else:
        print("  all of them fit together")


def _cmd_serve(args: argparse.Namespace) -> int:
    from .app import serve

    try:
        cfg = cfgmod.load(args.config)
    except cfgmod.ConfigError as err:  # a start-up failure: one line (`check` lists them one a line)
        return serve.fail(f"invalid config: {'; '.join(err.problems)}")
    host = args.host or cfg.listen.host
    port = args.port if args.port is not None else cfg.listen.port
    return serve.run(cfg, args.config, host, port)


def _cmd_usage(args: argparse.Namespace) -> int:
    from .usage import report
    from .usage.windows import parse_time

    cfg = _load(args.config)
    if cfg is None:
        return 2
    try:
        since = parse_time(args.since) if args.since else None
        until = parse_time(args.until) if args.until else None
    except ValueError as err:
        print(f"usage: {err}", file=sys.stderr)
        return 2
    try:
        found = report.rows(cfg, since, until, args.key, args.model, args.by)
    except Exception as err:  # an unreadable file, an unreachable Redis: one line, not a trace
        print(f"usage: cannot read the ledger: {err}", file=sys.stderr)
        return 1
    print(report.dumps(found) if args.json else report.table(found, args.by))
    if not found and not args.json:
        print(f"(nothing recorded{' in that range' if since or until else ''}: {report.where(cfg)})", file=sys.stderr)
    return 0


def _cmd_config_reference(args: argparse.Namespace) -> int:
    from .ops import config_reference

    try:
        block = config_reference.generate()
    except config_reference.Undocumented as err:
        print(f"config-reference: {err}", file=sys.stderr)
        return 1
    if not args.write:
        sys.stdout.write(block)
        return 0
    try:
        with open(args.write, encoding="utf-8") as f:
            page = f.read()
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(config_reference.rewrite(page, block))
    except OSError as err:
        print(f"config-reference: {args.write}: {err.strerror}", file=sys.stderr)
        return 1
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("homelab-frontend")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _cmd_demo(args: argparse.Namespace) -> int:
    from .app import demo

    return demo.run(args)


def _cmd_stub(args: argparse.Namespace) -> int:
    from .stub import cli as stub_cli

    return stub_cli.run(args)


def build_parser(with_stub: bool = False) -> argparse.ArgumentParser:
    """The command line. `with_stub`: the stub's own options too (they import the stub's server,
    which `serve`'s start has no use for)."""
    parser = argparse.ArgumentParser(prog="homelab-frontend", description=__doc__)
    parser.add_argument("-V", "--version", action="version", version=f"homelab-frontend {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the gateway")
    p.add_argument("--config", required=True, help="YAML config file")
    p.add_argument("--host", help="override listen.host")
    p.add_argument("--port", type=int, help="override listen.port (0: any free port)")
    p.set_defaults(fn=_cmd_serve)

    p = sub.add_parser("check", help="validate a config file and the environment it names; print the routing table",
                       description="Exit status 0: serve runs it; 1: serve runs it, with warnings (stderr); "
                                   "2: serve refuses it (one line per problem on stderr, naming its key path).")
    p.add_argument("--config", required=True, help="YAML config file")
    p.set_defaults(fn=_cmd_check)

    p = sub.add_parser("usage", help="tokens per key and model, from the usage ledger (no gateway needed)")
    p.add_argument("--config", required=True, help="the gateway's YAML config file (it says where the ledger is)")
    p.add_argument("--since", help="ISO 8601 or Unix seconds (default: everything kept)")
    p.add_argument("--until", help="ISO 8601 or Unix seconds (default: now)")
    p.add_argument("--key", help="one client key's rows, by its name")
    p.add_argument("--model", help="one model's rows, by the name clients send")
    p.add_argument("--by", choices=("hour", "day"), help="one row per UTC hour or day (default: totals)")
    p.add_argument("--json", action="store_true", help="the rows as JSON")
    p.set_defaults(fn=_cmd_usage)

    p = sub.add_parser("demo", help="the gateway in front of two stand-in backends")
    p.add_argument("--port", type=int, default=8080, help="the gateway's port (default: 8080)")
    p.add_argument("--host", default="127.0.0.1", help="the gateway's address (default: 127.0.0.1)")
    p.add_argument("--token-delay-ms", type=int, default=20, help="the stubs' time per token (default: 20)")
    p.set_defaults(fn=_cmd_demo)

    p = sub.add_parser("config-reference", help="every config key with its type, default and meaning (Markdown)")
    p.add_argument("--write", metavar="FILE", help="replace the generated part of FILE (docs/configuration.md)")
    p.set_defaults(fn=_cmd_config_reference)

    p = sub.add_parser("stub", help="a stand-in upstream (vLLM-, Ollama- or llama.cpp-flavoured)")
    p.set_defaults(fn=_cmd_stub)
    if with_stub:
        from .stub import cli as stub_cli

        stub_cli.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(with_stub=argv[:1] == ["stub"])
    args = parser.parse_args(argv)
    try:
        return args.fn(args) or 0
    except BrokenPipeError:  # `check ... | head`: the reader left; end quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141


if __name__ == "__main__":
    sys.exit(main())
