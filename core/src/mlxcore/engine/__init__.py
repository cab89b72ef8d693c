"""The generation engine: one thread that owns MLX, and the strategy interfaces
(cache, prefill, decoder) that plugins implement."""
