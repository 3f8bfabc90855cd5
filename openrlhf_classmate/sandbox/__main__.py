"""``python -m openrlhf_classmate.sandbox [--host 127.0.0.1] [--port 8001] [...]``: run the sandbox service.

The isolation is chosen and checked (a probe program runs in it) before the port opens; a setting or environment
that cannot work stops the start with one ``error: ...`` line. Ctrl-C / SIGTERM stop it: runs in progress are
killed, the slot cgroups removed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys

from openrlhf_classmate.config_fields import arg_type
from openrlhf_classmate.sandbox.config import SandboxConfig


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        # a None default is resolved at start-up (CPU count, interpreter); the help text says how
        return action.help if action.default is None else super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m openrlhf_classmate.sandbox", description=__doc__.split("\n\n")[0],
                                     formatter_class=_Formatter)
    for f in dataclasses.fields(SandboxConfig):
        meta = dict(f.metadata)
        kwargs = {"help": meta.pop("help"), **meta}
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if f.name == "max_concurrency":
            default = None  # resolved by the dataclass (CPU count); keeps --help machine-independent
        kwargs["default"] = default
        kwargs["type"], nargs = arg_type(SandboxConfig, f.name)  # the config has no bool switches
        if nargs is not None:
            kwargs.setdefault("nargs", nargs)
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, **kwargs)
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return parser


def config_from_args(argv: list[str] | None = None) -> tuple[SandboxConfig, str]:
    args = vars(build_parser().parse_args(argv))
    log_level = args.pop("log_level")
    if args["max_concurrency"] is None:
        args.pop("max_concurrency")
    try:
        return SandboxConfig(**args), log_level
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


async def serve(cfg: SandboxConfig, log_level: str = "info") -> None:
    import uvicorn

    from openrlhf_classmate.sandbox.app import create_app
    from openrlhf_classmate.sandbox.service import Sandbox, SandboxError

    box = Sandbox(cfg)
    try:
        await box.start()
    except SandboxError as e:
        raise SystemExit(f"error: {e}") from None
    try:
        iso = box.isolation
        cgroups = f"v{iso.cgroups.version}" if iso.cgroups else "off"
        print(f"[sandbox] isolation {iso.mode} (python {iso.python}, cgroups {cgroups}), {cfg.max_concurrency} slots; "
              f"serving on http://{cfg.host}:{cfg.port}", file=sys.stderr, flush=True)
        for note in iso.degraded:
            print(f"[sandbox] degraded: {note}", file=sys.stderr, flush=True)
        config = uvicorn.Config(create_app(cfg, box), host=cfg.host, port=cfg.port, log_level=log_level,
                                access_log=log_level == "debug", timeout_graceful_shutdown=5, lifespan="on")
        server = uvicorn.Server(config)
        await server.serve()
        if not server.started:
            raise SystemExit(f"error: could not listen on {cfg.host}:{cfg.port} (in use?)")
    finally:
        await box.stop()


def main(argv: list[str] | None = None) -> None:
    cfg, log_level = config_from_args(argv)
    logging.basicConfig(level=log_level.upper(), format="[sandbox] %(levelname)s %(message)s")
    asyncio.run(serve(cfg, log_level))


if __name__ == "__main__":
    main()
