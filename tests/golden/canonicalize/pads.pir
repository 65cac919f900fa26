// RUN: canonicalize
// A pad that adds nothing goes. Zeros padded on the spatial dims only, as many before as after,
// become the convolution's own padding (with or without a bias, grouped and dilated too); a
// pad with another value, or uneven as TensorFlow's "same" padding is at stride 2, stays. The
// pad a convolution no longer reads stays while another value reads it.
graph @f(
    %x: f32[2,3,8,8],
    %w: f32[4,3,3,3],
    %b: f32[4],
    %wd: f32[3,1,3,3]
) -> (f32[2,4,8,8], f32[2,4,8,8], f32[2,4,4,4], f32[2,4,10,10], f32[2,4,8,8], f32[2,3,8,8], f32[2,3,10,10]) {
  %0 = pad(%x) {pads=[0, 0, 0, 0, 1, 1, 1, 1]} : f32[2,3,10,10]
  %1 = conv2d(%0, %w) : f32[2,4,8,8]
  %2 = conv2d(%0, %w, %b) : f32[2,4,8,8]
  %3 = pad(%x) {pads=[0, 0, 0, 0, 0, 1, 0, 1]} : f32[2,3,9,9]
  %4 = conv2d(%3, %w) {stride=[2, 2]} : f32[2,4,4,4]
  %5 = pad(%x) {pads=[0, 0, 0, 0, 1, 1, 1, 1], value=1.0} : f32[2,3,10,10]
  %6 = conv2d(%5, %w) {padding=[1, 1]} : f32[2,4,10,10]
  %7 = pad(%x) {pads=[0, 0, 0, 0, 0, 0, 0, 0]} : f32[2,3,8,8]
  %8 = conv2d(%7, %w, %b) {padding=[1, 1]} : f32[2,4,8,8]
  %9 = pad(%x) {pads=[0, 0, 0, 0, 2, 2, 2, 2]} : f32[2,3,12,12]
  %10 = conv2d(%9, %wd) {dilation=[2, 2], groups=3} : f32[2,3,8,8]
  return %1, %2, %4, %6, %8, %10, %0
}
// EXPECT:
graph @f(
    %x: f32[2,3,8,8],
    %w: f32[4,3,3,3],
    %b: f32[4],
    %wd: f32[3,1,3,3]
) -> (f32[2,4,8,8], f32[2,4,8,8], f32[2,4,4,4], f32[2,4,10,10], f32[2,4,8,8], f32[2,3,8,8], f32[2,3,10,10]) {
  %0 = pad(%x) {pads=[0, 0, 0, 0, 1, 1, 1, 1]} : f32[2,3,10,10]
  %1 = conv2d(%x, %w) {padding=[1, 1]} : f32[2,4,8,8]
  %2 = conv2d(%x, %w, %b) {padding=[1, 1]} : f32[2,4,8,8]
  %3 = pad(%x) {pads=[0, 0, 0, 0, 0, 1, 0, 1]} : f32[2,3,9,9]
  %4 = conv2d(%3, %w) {stride=[2, 2]} : f32[2,4,4,4]
  %5 = pad(%x) {pads=[0, 0, 0, 0, 1, 1, 1, 1], value=1.0} : f32[2,3,10,10]
  %6 = conv2d(%5, %w) {padding=[1, 1]} : f32[2,4,10,10]
  %7 = conv2d(%x, %w, %b) {padding=[1, 1]} : f32[2,4,8,8]
  %8 = conv2d(%x, %wd) {padding=[2, 2], dilation=[2, 2], groups=3} : f32[2,3,8,8]
  return %1, %2, %4, %6, %7, %8, %0
}
