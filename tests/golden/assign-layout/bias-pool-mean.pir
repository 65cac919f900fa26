// RUN: assign-layout
// A per-channel bias [8,1,1] added on NHWC is reshaped to [1,1,1,8] (one dim above 1: the
// elements keep their order, nothing moves), the max pool keeps its NCHW form and reads the
// relu through the NCHW view, and the mean over H and W keeps its dims (keepdim) with its axes
// remapped to NHWC ([1, 2]). Its [2,1,1,8] result leaves the region through a reshape to
// [2,8,1,1]: the dims above 1 keep their order, so nothing moves and no layout change is
// placed. The second convolution saves the conversion of the pool's 2*8*6*5 elements (the
// pool keeps the channels-last memory of its NHWC input).
graph @f(
    %x: f32[2,3,12,10],
    %w1: f32[8,3,3,3] param,
    %b: f32[8,1,1] param,
    %w2: f32[8,8,3,3] param
) -> (f32[2,8]) {
  %0 = conv2d_pointwise(%x, %w1) {padding=[1, 1]} : f32[2,8,12,10]
  %1 = add(%0, %b) : f32[2,8,12,10]
  %2 = relu(%1) : f32[2,8,12,10]
  %3 = max_pool2d(%2) {kernel=[2, 2]} : f32[2,8,6,5]
  %4 = conv2d_pointwise(%3, %w2) {padding=[1, 1], unary="relu"} : f32[2,8,6,5]
  %5 = mean(%4) {axes=[3, 2], keepdim=true} : f32[2,8,1,1]
  %6 = reshape(%5) {shape=[2, 8]} : f32[2,8]
  return %6
}
// EXPECT:
graph @f(
    %x: f32[2,3,12,10],
    %w1: f32[8,3,3,3] param,
    %b: f32[8,1,1] param,
    %w2: f32[8,8,3,3] param
) -> (f32[2,8]) {
  %0 = conv2d_pointwise(%x, %w1) {padding=[1, 1]} : f32[2,8,12,10]
  %1 = transpose(%0) {perm=[0, 2, 3, 1]} : f32[2,12,10,8]
  %2 = reshape(%b) {shape=[1, 1, 1, 8]} : f32[1,1,1,8]
  %3 = add(%1, %2) : f32[2,12,10,8]
  %4 = relu(%3) : f32[2,12,10,8]
  %5 = transpose(%4) {perm=[0, 3, 1, 2]} : f32[2,8,12,10]
  %6 = max_pool2d(%5) {kernel=[2, 2]} : f32[2,8,6,5]
  %7 = conv2d_pointwise(%6, %w2) {padding=[1, 1], unary="relu"} : f32[2,8,6,5]
  %8 = transpose(%7) {perm=[0, 2, 3, 1]} : f32[2,6,5,8]
  %9 = mean(%8) {axes=[1, 2], keepdim=true} : f32[2,1,1,8]
  %10 = reshape(%9) {shape=[2, 8, 1, 1]} : f32[2,8,1,1]
  %11 = reshape(%10) {shape=[2, 8]} : f32[2,8]
  return %11
}
