"""The run recording: its layout (:mod:`~otelprof.recording.schema`), the writer the runtime uses, the reader
everything offline uses (the only parser), the OTLP-JSON encoding and remote storage.

May import: the catalog and configuration modules at the top of ``otelprof`` only."""
