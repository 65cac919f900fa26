// RUN: assign-layout
// Graphs the pass does not apply to are left unchanged: 4-d elementwise ops and a pool with no
// library convolution (%0 .. %2), 3-d convolutions (conv3d, %3 .. %5), and library
// convolutions whose results are read in a way that is not NCHW: a transpose that swaps H and
// W (%7) and a softmax over the channels (%10) are outside any region, so each convolution is
// a region of its own that saves nothing.
graph @f(
    %x: f32[2,4,6,6],
    %y: f32[2,4,6,6],
    %v: f32[1,4,4,5,5],
    %k: f32[4,4,3,3,3] param,
    %w: f32[4,4,3,3] param
) -> (f32[2,4,3,3], f32[1,4,4,5,5], f32[2,4,6,6]) {
  %0 = add(%x, %y) : f32[2,4,6,6]
  %1 = relu(%0) : f32[2,4,6,6]
  %2 = max_pool2d(%1) {kernel=[2, 2]} : f32[2,4,3,3]
  %3 = conv3d(%v, %k) {padding=[1, 1, 1]} : f32[1,4,4,5,5]
  %4 = relu(%3) : f32[1,4,4,5,5]
  %5 = conv3d(%4, %k) {padding=[1, 1, 1]} : f32[1,4,4,5,5]
  %6 = conv2d_pointwise(%x, %w) {padding=[1, 1]} : f32[2,4,6,6]
  %7 = transpose(%6) {perm=[0, 1, 3, 2]} : f32[2,4,6,6]
  %8 = relu(%7) : f32[2,4,6,6]
  %9 = conv2d_pointwise(%8, %w) {padding=[1, 1]} : f32[2,4,6,6]
  %10 = softmax(%9) {axis=1} : f32[2,4,6,6]
  %11 = conv2d_pointwise(%10, %w) {padding=[1, 1]} : f32[2,4,6,6]
  return %2, %5, %11
}
// EXPECT:
graph @f(
    %x: f32[2,4,6,6],
    %y: f32[2,4,6,6],
    %v: f32[1,4,4,5,5],
    %k: f32[4,4,3,3,3] param,
    %w: f32[4,4,3,3] param
) -> (f32[2,4,3,3], f32[1,4,4,5,5], f32[2,4,6,6]) {
  %0 = add(%x, %y) : f32[2,4,6,6]
  %1 = relu(%0) : f32[2,4,6,6]
  %2 = max_pool2d(%1) {kernel=[2, 2]} : f32[2,4,3,3]
  %3 = conv3d(%v, %k) {padding=[1, 1, 1]} : f32[1,4,4,5,5]
  %4 = relu(%3) : f32[1,4,4,5,5]
  %5 = conv3d(%4, %k) {padding=[1, 1, 1]} : f32[1,4,4,5,5]
  %6 = conv2d_pointwise(%x, %w) {padding=[1, 1]} : f32[2,4,6,6]
  %7 = transpose(%6) {perm=[0, 1, 3, 2]} : f32[2,4,6,6]
  %8 = relu(%7) : f32[2,4,6,6]
  %9 = conv2d_pointwise(%8, %w) {padding=[1, 1]} : f32[2,4,6,6]
  %10 = softmax(%9) {axis=1} : f32[2,4,6,6]
  %11 = conv2d_pointwise(%10, %w) {padding=[1, 1]} : f32[2,4,6,6]
  return %2, %5, %11
}
