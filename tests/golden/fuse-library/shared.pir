// RUN: fuse-library
// An intermediate result read by anything else ends the epilogue: the convolution's result
// is also returned, so the relu stays; the bias add's result is read twice, so the gelu stays.
graph @f(
    %x: f32[1,2,5,5],
    %w: f32[3,2,3,3] param,
    %a: f32[4,8],
    %v: f32[8,16] param,
    %c: f32[16] param
) -> (f32[1,3,3,3], f32[1,3,3,3], f32[4,16], f32[4,16]) {
  %0 = conv2d(%x, %w) : f32[1,3,3,3]
  %1 = relu(%0) : f32[1,3,3,3]
  %2 = matmul(%a, %v) : f32[4,16]
  %3 = add(%2, %c) : f32[4,16]
  %4 = gelu(%3) : f32[4,16]
  %5 = mul(%3, %3) : f32[4,16]
  return %0, %1, %4, %5
}
// EXPECT:
graph @f(
    %x: f32[1,2,5,5],
    %w: f32[3,2,3,3] param,
    %a: f32[4,8],
    %v: f32[8,16] param,
    %c: f32[16] param
) -> (f32[1,3,3,3], f32[1,3,3,3], f32[4,16], f32[4,16]) {
  %0 = conv2d_pointwise(%x, %w) : f32[1,3,3,3]
  %1 = relu(%0) : f32[1,3,3,3]
  %2 = linear_pointwise(%a, %v, %c) : f32[4,16]
  %3 = gelu(%2) : f32[4,16]
  %4 = mul(%2, %2) : f32[4,16]
  return %0, %1, %3, %4
}
