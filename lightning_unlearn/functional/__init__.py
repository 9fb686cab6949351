"""Pure-torch math of each method: no Lightning, no Avalanche. Callbacks and strategies both call these."""
