"""Compile-check worker: reads {"arch", "jobs"} as JSON on stdin, imports each job's file and calls its
`compile_for(arch, sizes)`, printing one JSON line per file as it finishes (so a crash still reports the files
before it)."""
import importlib.util
import json
import sys
import time
import traceback


def main() -> None:
    request = json.load(sys.stdin)
    for index, job in enumerate(request["jobs"]):
        started = time.monotonic()
        error = ""
        try:
            spec = importlib.util.spec_from_file_location(f"mkb_compile_check_{index}", job["path"])
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            module.compile_for(request["arch"], [dict(s) for s in job["sizes"]])
        except Exception:
            error = traceback.format_exc()[-4000:]
        print(json.dumps({"key": job["key"], "ok": not error, "seconds": time.monotonic() - started,
                          "error": error}), flush=True)


if __name__ == "__main__":
    main()
