"""``python -m consumer.healthcheck``: exit 0 when the daemon's /healthz answers 200.

The container image's HEALTHCHECK. The port defaults to ``$ARROWAGG_SERVICE__HTTP_PORT``
or the config's default, 9464; the daemon must run with ``service.http_port`` set.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request

DEFAULT_PORT = 9464


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m consumer.healthcheck",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int,
                        default=int(os.environ.get("ARROWAGG_SERVICE__HTTP_PORT")
                                    or DEFAULT_PORT))
    parser.add_argument("--path", default="/healthz", choices=["/healthz", "/readyz"])
    parser.add_argument("--timeout-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    url = f"http://{args.host}:{args.port}{args.path}"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout_s) as response:
            status = int(response.status)
    except urllib.error.HTTPError as err:
        status = err.code
    except OSError as err:
        sys.stderr.write(f"healthcheck: {url}: {err}\n")
        return 1
    if status != 200:
        sys.stderr.write(f"healthcheck: {url}: HTTP {status}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
