"""Test harness for ``/test_program``: runs inside the sandbox, in the program's own interpreter.

The service passes this file's text with ``python -I -B -c``; the working directory holds ``program.py``,
``.test`` (one assert statement, or any test code) and ``.nonce``. The harness reads and deletes ``.test`` and
``.nonce`` before the program runs (so the program cannot read the test from disk), runs the program and then the
test in one namespace (``__name__ == "__main__"``, as if the test were appended to the program), and writes its
verdict, tagged with the nonce and its pid, to file descriptor 3. The service only believes a tagged verdict from
the program's first process (not from processes it forked) that then exited normally, so a program that exits early (``sys.exit(0)``, ``os._exit(0)``), kills itself or
prints a fake verdict does not pass. A program that deliberately digs the nonce out of the harness's memory can
forge a verdict, as with any in-process harness; stdin/stdout tests (``/test_program_stdio``) are judged outside
the sandbox and are not exposed to that.

Standard library only, and valid on every Python 3 the sandbox may run.
"""

import json
import os
import sys


def _harness():
    with open(".nonce") as f:
        tag = f.read()
    os.unlink(".nonce")
    with open(".test") as f:
        test = f.read()
    os.unlink(".test")
    with open("program.py", encoding="utf-8", errors="surrogateescape") as f:
        program = f.read()
    out = os.fdopen(3, "w")

    def report(verdict, detail=""):
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001, S110
            pass
        out.write("\n" + tag + " " + json.dumps({"verdict": verdict, "detail": detail[:500], "pid": os.getpid()}) + "\n")
        out.flush()
        os._exit(0 if verdict == "pass" else 1)  # no atexit hooks or lingering threads of the program

    scope = {"__name__": "__main__", "__builtins__": __builtins__, "__file__": "program.py"}
    stage = "program"
    try:
        exec(compile(program, "program.py", "exec"), scope)
        stage = "test"
        exec(compile(test, "test", "exec"), scope)
    except AssertionError as e:
        report("assertion" if stage == "test" else "exception",
               f"AssertionError in the {stage}" + (f": {e}" if str(e) else ""))
    except MemoryError:
        report("memory", f"MemoryError in the {stage}")
    except SystemExit as e:
        report("exit", f"SystemExit({e.code!r}) in the {stage}")
    except BaseException as e:  # noqa: BLE001
        report("exception", f"{type(e).__name__} in the {stage}: {e}")
    report("pass")


if __name__ == "__main__":
    _harness()
