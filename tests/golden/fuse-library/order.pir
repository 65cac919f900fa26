// RUN: fuse-library
// The post-ops keep the graph's order. relu before the residual add: the relu is taken and
// the add stays (oneDNN applies a binary post-op before the unary one). gelu after a residual
// add: the add is taken and gelu stays (oneDNN's binary overload takes only relu after it).
graph @f(
    %x: f32[1,2,6,6],
    %w: f32[2,2,3,3] param,
    %s: f32[1,2,6,6]
) -> (f32[1,2,6,6], f32[1,2,6,6]) {
  %0 = conv2d(%x, %w) {padding=[1, 1]} : f32[1,2,6,6]
  %1 = relu(%0) : f32[1,2,6,6]
  %2 = add(%1, %s) : f32[1,2,6,6]
  %3 = conv2d(%x, %w) {padding=[1, 1]} : f32[1,2,6,6]
  %4 = add(%s, %3) : f32[1,2,6,6]
  %5 = gelu(%4) : f32[1,2,6,6]
  return %2, %5
}
// EXPECT:
graph @f(
    %x: f32[1,2,6,6],
    %w: f32[2,2,3,3] param,
    %s: f32[1,2,6,6]
) -> (f32[1,2,6,6], f32[1,2,6,6]) {
  %0 = conv2d_pointwise(%x, %w) {padding=[1, 1], unary="relu"} : f32[1,2,6,6]
  %1 = add(%0, %s) : f32[1,2,6,6]
  %2 = conv2d_pointwise(%x, %w, %s) {padding=[1, 1], binary="add"} : f32[1,2,6,6]
  %3 = gelu(%2) : f32[1,2,6,6]
  return %1, %3
}
