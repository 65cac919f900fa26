// RUN: assign-layout
// A graph input added inside the region enters through a transpose to NHWC, and the sigmoid
// the graph returns leaves through a transpose to NCHW: two layout changes, 2*6*5*7 elements
// each. Three convolutions read NHWC results (the add, two relus), which saves three
// conversions of as many elements: more than the two layout changes cost, so the region is
// rewritten. The relu that the first convolution takes as its input is outside the region
// (it reads no region value), and the convolution reads its NCHW result as before.
graph @f(
    %x: f32[2,6,5,7],
    %skip: f32[2,6,5,7],
    %w1: f32[6,6,3,3] param,
    %w2: f32[6,6,3,3] param,
    %w3: f32[6,6,3,3] param,
    %w4: f32[6,6,3,3] param
) -> (f32[2,6,5,7]) {
  %0 = relu(%x) : f32[2,6,5,7]
  %1 = conv2d_pointwise(%0, %w1) {padding=[1, 1]} : f32[2,6,5,7]
  %2 = add(%1, %skip) : f32[2,6,5,7]
  %3 = conv2d_pointwise(%2, %w2) {padding=[1, 1]} : f32[2,6,5,7]
  %4 = relu(%3) : f32[2,6,5,7]
  %5 = conv2d_pointwise(%4, %w3) {padding=[1, 1]} : f32[2,6,5,7]
  %6 = relu(%5) : f32[2,6,5,7]
  %7 = conv2d_pointwise(%6, %w4) {padding=[1, 1]} : f32[2,6,5,7]
  %8 = sigmoid(%7) : f32[2,6,5,7]
  return %8
}
// EXPECT:
graph @f(
    %x: f32[2,6,5,7],
    %skip: f32[2,6,5,7],
    %w1: f32[6,6,3,3] param,
    %w2: f32[6,6,3,3] param,
    %w3: f32[6,6,3,3] param,
    %w4: f32[6,6,3,3] param
) -> (f32[2,6,5,7]) {
  %0 = relu(%x) : f32[2,6,5,7]
  %1 = conv2d_pointwise(%0, %w1) {padding=[1, 1]} : f32[2,6,5,7]
  %2 = transpose(%1) {perm=[0, 2, 3, 1]} : f32[2,5,7,6]
  %3 = transpose(%skip) {perm=[0, 2, 3, 1]} : f32[2,5,7,6]
  %4 = add(%2, %3) : f32[2,5,7,6]
  %5 = transpose(%4) {perm=[0, 3, 1, 2]} : f32[2,6,5,7]
  %6 = conv2d_pointwise(%5, %w2) {padding=[1, 1]} : f32[2,6,5,7]
  %7 = transpose(%6) {perm=[0, 2, 3, 1]} : f32[2,5,7,6]
  %8 = relu(%7) : f32[2,5,7,6]
  %9 = transpose(%8) {perm=[0, 3, 1, 2]} : f32[2,6,5,7]
  %10 = conv2d_pointwise(%9, %w3) {padding=[1, 1]} : f32[2,6,5,7]
  %11 = transpose(%10) {perm=[0, 2, 3, 1]} : f32[2,5,7,6]
  %12 = relu(%11) : f32[2,5,7,6]
  %13 = transpose(%12) {perm=[0, 3, 1, 2]} : f32[2,6,5,7]
  %14 = conv2d_pointwise(%13, %w4) {padding=[1, 1]} : f32[2,6,5,7]
  %15 = transpose(%14) {perm=[0, 2, 3, 1]} : f32[2,5,7,6]
  %16 = sigmoid(%15) : f32[2,5,7,6]
  %17 = transpose(%16) {perm=[0, 3, 1, 2]} : f32[2,6,5,7]
  return %17
}
