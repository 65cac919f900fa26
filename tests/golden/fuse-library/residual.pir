// RUN: fuse-library,dce
// A convolution without a bias, a per-channel bias added after it (through a reshape), the
// residual add and the relu: one node whose operands are x, weight, bias and the residual.
// The 1x1 downsampling convolution that makes the residual becomes a conv2d_pointwise too.
graph @f(
    %x: f32[2,4,8,8],
    %w: f32[8,4,3,3] param,
    %b: f32[8] param,
    %wd: f32[8,4,1,1] param
) -> (f32[2,8,4,4]) {
  %0 = conv2d(%x, %w) {stride=[2, 2], padding=[1, 1]} : f32[2,8,4,4]
  %1 = reshape(%b) {shape=[1, 8, 1, 1]} : f32[1,8,1,1]
  %2 = add(%0, %1) : f32[2,8,4,4]
  %3 = conv2d(%x, %wd) {stride=[2, 2]} : f32[2,8,4,4]
  %4 = add(%3, %2) : f32[2,8,4,4]
  %5 = relu(%4) : f32[2,8,4,4]
  return %5
}
// EXPECT:
graph @f(
    %x: f32[2,4,8,8],
    %w: f32[8,4,3,3] param,
    %b: f32[8] param,
    %wd: f32[8,4,1,1] param
) -> (f32[2,8,4,4]) {
  %0 = conv2d_pointwise(%x, %wd) {stride=[2, 2]} : f32[2,8,4,4]
  %1 = conv2d_pointwise(%x, %w, %b, %0) {stride=[2, 2], padding=[1, 1], binary="add", unary="relu"} : f32[2,8,4,4]
  return %1
}
