"""Run a script with the OpenTelemetry SDK exporting every span to a file, one JSON object a line:
``python otel_export.py <spans.jsonl> <script.py> [args...]``.

The SDK's ``ConsoleSpanExporter`` writes to the file (flushed per span, so a process stopped by
SIGTERM loses nothing); the script then runs as ``__main__``.  Used by the tracing tests for the
``dag.test()`` process and the worker process alike.
"""

from __future__ import annotations

import json
import runpy
import sys

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor


def _line(span) -> str:  # span: an SDK ReadableSpan
    ctx = span.get_span_context()
    return (
        json.dumps(
            {
                "name": span.name,
                "trace_id": f"{ctx.trace_id:032x}",
                "span_id": f"{ctx.span_id:016x}",
                "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
                "kind": span.kind.name,
                "attributes": {k: (list(v) if isinstance(v, tuple) else v) for k, v in (span.attributes or {}).items()},
                "links": [f"{link.context.span_id:016x}" for link in span.links],
                "status": span.status.status_code.name,
                "events": [e.name for e in span.events],
            }
        )
        + "\n"
    )


def main() -> None:
    path, script = sys.argv[1], sys.argv[2]
    out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the life of the process
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=_line)))
    trace.set_tracer_provider(provider)
    sys.argv = [script, *sys.argv[3:]]
    sys.path.insert(0, str(__import__("pathlib").Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
