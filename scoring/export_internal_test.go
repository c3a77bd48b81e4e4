package scoring

// PoissonShortfall is poissonShortfall, for the simulator's oracles in
// package scoring_test: the bounds they give use the same arithmetic as
// the engine.
var PoissonShortfall = poissonShortfall
