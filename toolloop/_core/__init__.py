"""Pure core of the tool loop: contracts, tool registry, validation, dispatch planning. No I/O."""
