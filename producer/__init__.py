"""arrowagg's workers' side: encode Arrow/Polars data into the wire format and publish it."""
