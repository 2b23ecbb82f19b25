"""toolloop: a durable tool-calling loop on Temporal."""
