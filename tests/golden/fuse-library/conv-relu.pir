// RUN: fuse-library
// A convolution with its bias and the relu after it is one conv2d_pointwise with a relu post-op.
graph @f(%x: f32[2,3,8,8], %w: f32[4,3,3,3] param, %b: f32[4] param) -> (f32[2,4,8,8]) {
  %0 = conv2d(%x, %w, %b) {padding=[1, 1]} : f32[2,4,8,8]
  %1 = relu(%0) : f32[2,4,8,8]
  return %1
}
// EXPECT:
graph @f(%x: f32[2,3,8,8], %w: f32[4,3,3,3] param, %b: f32[4] param) -> (f32[2,4,8,8]) {
  %0 = conv2d_pointwise(%x, %w, %b) {padding=[1, 1], unary="relu"} : f32[2,4,8,8]
  return %0
}
