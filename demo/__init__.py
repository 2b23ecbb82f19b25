"""The bundled demo: a business service, its tools and an offline model, built on toolloop's public API."""
