"""Built-in plugins: the core's defaults, registered through the same hooks as any plugin."""
