"""The one output pipeline every front end uses: tokens in, client deltas out."""

from mlxcore.output.pipeline import OutputDelta, OutputPipeline

__all__ = ["OutputDelta", "OutputPipeline"]
