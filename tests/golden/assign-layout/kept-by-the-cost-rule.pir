// RUN: assign-layout
// Regions that do not pay are left as they are:
// - a convolution with a relu after it (%0, %1) and the graph output: nothing the pass could
//   hand a convolution in channels-last memory (saves 0);
// - a chain of convolutions with a residual and a mean over H and W after them (%2 .. %5),
//   as fuse-library leaves a ResNet: the library convolutions hand channels-last results to
//   each other already (saves 0);
// - two convolutions with a relu between them whose result is also returned (%6 .. %8): the
//   second convolution's saved conversion (2*4*6*6 elements) is no more than the exit that the
//   returned relu would need (as many elements), and the rule asks for more.
graph @f(
    %x: f32[2,4,6,6],
    %w: f32[4,4,3,3] param,
    %v: f32[4,4,1,1] param
) -> (f32[2,4,6,6], f32[2,4,1,1], f32[2,4,6,6], f32[2,4,6,6]) {
  %0 = conv2d_pointwise(%x, %w) {padding=[1, 1]} : f32[2,4,6,6]
  %1 = relu(%0) : f32[2,4,6,6]
  %2 = conv2d_pointwise(%x, %w) {padding=[1, 1], unary="relu"} : f32[2,4,6,6]
  %3 = conv2d_pointwise(%2, %v) {unary="relu"} : f32[2,4,6,6]
  %4 = conv2d_pointwise(%3, %w, %2) {padding=[1, 1], binary="add", unary="relu"} : f32[2,4,6,6]
  %5 = mean(%4) {axes=[3, 2], keepdim=true} : f32[2,4,1,1]
  %6 = conv2d_pointwise(%x, %v) : f32[2,4,6,6]
  %7 = relu(%6) : f32[2,4,6,6]
  %8 = conv2d_pointwise(%7, %w) {padding=[1, 1]} : f32[2,4,6,6]
  return %1, %5, %7, %8
}
// EXPECT:
graph @f(
    %x: f32[2,4,6,6],
    %w: f32[4,4,3,3] param,
    %v: f32[4,4,1,1] param
) -> (f32[2,4,6,6], f32[2,4,1,1], f32[2,4,6,6], f32[2,4,6,6]) {
  %0 = conv2d_pointwise(%x, %w) {padding=[1, 1]} : f32[2,4,6,6]
  %1 = relu(%0) : f32[2,4,6,6]
  %2 = conv2d_pointwise(%x, %w) {padding=[1, 1], unary="relu"} : f32[2,4,6,6]
  %3 = conv2d_pointwise(%2, %v) {unary="relu"} : f32[2,4,6,6]
  %4 = conv2d_pointwise(%3, %w, %2) {padding=[1, 1], binary="add", unary="relu"} : f32[2,4,6,6]
  %5 = mean(%4) {axes=[3, 2], keepdim=true} : f32[2,4,1,1]
  %6 = conv2d_pointwise(%x, %v) : f32[2,4,6,6]
  %7 = relu(%6) : f32[2,4,6,6]
  %8 = conv2d_pointwise(%7, %w) {padding=[1, 1]} : f32[2,4,6,6]
  return %1, %5, %7, %8
}
