// RUN: assign-layout
// After fuse-kernels: a fused kernel between two convolutions (bias add and ReLU6 over a
// [6,1,1] operand) joins the region. Its body is rewritten on NHWC types, the 4-d operand is
// read through a view, and the [6,1,1] operand is reshaped to [1,1,1,6]. The residual
// operand of the second convolution is the first convolution's own result, which stays NCHW.
graph @f(
    %x: f32[1,4,9,7],
    %w1: f32[6,4,3,3] param,
    %b: f32[6,1,1] param,
    %w2: f32[6,6,1,1] param
) -> (f32[1,6,9,7]) {
  %0 = conv2d_pointwise(%x, %w1) {padding=[1, 1]} : f32[1,6,9,7]
  %1 = fused(%0, %b) {body="graph @kernel(%x0: f32[1,6,9,7], %x1: f32[6,1,1]) -> (f32[1,6,9,7]) {\n  %0 = add(%x0, %x1) : f32[1,6,9,7]\n  %1 = full() {shape=[], value=0.0} : f32[]\n  %2 = maximum(%0, %1) : f32[1,6,9,7]\n  %3 = full() {shape=[], value=6.0} : f32[]\n  %4 = minimum(%2, %3) : f32[1,6,9,7]\n  return %4\n}\n"} : f32[1,6,9,7]
  %2 = conv2d_pointwise(%1, %w2, %0) {binary="add", unary="relu"} : f32[1,6,9,7]
  return %2
}
// EXPECT:
graph @f(
    %x: f32[1,4,9,7],
    %w1: f32[6,4,3,3] param,
    %b: f32[6,1,1] param,
    %w2: f32[6,6,1,1] param
) -> (f32[1,6,9,7]) {
  %0 = conv2d_pointwise(%x, %w1) {padding=[1, 1]} : f32[1,6,9,7]
  %1 = transpose(%0) {perm=[0, 2, 3, 1]} : f32[1,9,7,6]
  %2 = reshape(%b) {shape=[1, 1, 1, 6]} : f32[1,1,1,6]
  %3 = fused(%1, %2) {body="graph @kernel(%x0: f32[1,9,7,6], %x1: f32[1,1,1,6]) -> (f32[1,9,7,6]) {\n  %0 = add(%x0, %x1) : f32[1,9,7,6]\n  %1 = full() {shape=[], value=0.0} : f32[]\n  %2 = maximum(%0, %1) : f32[1,9,7,6]\n  %3 = full() {shape=[], value=6.0} : f32[]\n  %4 = minimum(%2, %3) : f32[1,9,7,6]\n  return %4\n}\n"} : f32[1,9,7,6]
  %4 = transpose(%3) {perm=[0, 3, 1, 2]} : f32[1,6,9,7]
  %5 = conv2d_pointwise(%4, %w2, %0) {binary="add", unary="relu"} : f32[1,6,9,7]
  return %5
}
