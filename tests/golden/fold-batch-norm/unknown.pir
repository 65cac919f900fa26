// RUN: fold-batch-norm
// Params whose values the graph does not hold (no weights loaded): nothing is known, nothing folds.
graph @f(
    %x: f32[1,2,4,4],
    %w: f32[2,2,3,3] param,
    %g: f32[2] param,
    %b: f32[2] param,
    %m: f32[2] state,
    %v: f32[2] state
) -> (f32[1,2,2,2]) {
  %0 = conv2d(%x, %w) : f32[1,2,2,2]
  %1 = batch_norm(%0, %g, %b, %m, %v) : f32[1,2,2,2]
  return %1
}
// EXPECT:
graph @f(
    %x: f32[1,2,4,4],
    %w: f32[2,2,3,3] param,
    %g: f32[2] param,
    %b: f32[2] param,
    %m: f32[2] state,
    %v: f32[2] state
) -> (f32[1,2,2,2]) {
  %0 = conv2d(%x, %w) : f32[1,2,2,2]
  %1 = batch_norm(%0, %g, %b, %m, %v) : f32[1,2,2,2]
  return %1
}
