// RUN: assign-layout
// ReLU6 (maximum, minimum) between two library convolutions computes on NHWC. It reads the
// first convolution's result through a transpose to NHWC, and the second convolution reads it
// through a transpose back to NCHW. Both transposes are views of channels-last memory, so no
// layout change is placed, and the second convolution no longer converts its input (the cost
// rule: saves 2*8*10*12 elements, costs 0). The scalar constants are used as they are.
graph @f(
    %x: f32[2,3,10,12],
    %w1: f32[8,3,3,3] param,
    %b1: f32[8] param,
    %w2: f32[8,8,3,3] param
) -> (f32[2,8,10,12]) {
  %0 = conv2d_pointwise(%x, %w1, %b1) {padding=[1, 1]} : f32[2,8,10,12]
  %1 = full() {shape=[], value=0.0} : f32[]
  %2 = maximum(%0, %1) : f32[2,8,10,12]
  %3 = full() {shape=[], value=6.0} : f32[]
  %4 = minimum(%2, %3) : f32[2,8,10,12]
  %5 = conv2d_pointwise(%4, %w2) {padding=[1, 1]} : f32[2,8,10,12]
  return %5
}
// EXPECT:
graph @f(
    %x: f32[2,3,10,12],
    %w1: f32[8,3,3,3] param,
    %b1: f32[8] param,
    %w2: f32[8,8,3,3] param
) -> (f32[2,8,10,12]) {
  %0 = conv2d_pointwise(%x, %w1, %b1) {padding=[1, 1]} : f32[2,8,10,12]
  %1 = transpose(%0) {perm=[0, 2, 3, 1]} : f32[2,10,12,8]
  %2 = full() {shape=[], value=0.0} : f32[]
  %3 = maximum(%1, %2) : f32[2,10,12,8]
  %4 = full() {shape=[], value=6.0} : f32[]
  %5 = minimum(%3, %4) : f32[2,10,12,8]
  %6 = transpose(%5) {perm=[0, 3, 1, 2]} : f32[2,8,10,12]
  %7 = conv2d_pointwise(%6, %w2) {padding=[1, 1]} : f32[2,8,10,12]
  return %7
}
