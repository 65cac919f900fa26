// RUN: fuse-kernels,dce
// A bias broadcast over rows and the activation after it are one kernel that reads the bias
// through a broadcast; the matmul stays.
graph @f(%x: f32[4,8], %w: f32[8,16] param, %b: f32[16] param) -> (f32[4,16]) {
  %0 = matmul(%x, %w) : f32[4,16]
  %1 = add(%0, %b) : f32[4,16]
  %2 = gelu(%1) : f32[4,16]
  return %2
}
// EXPECT:
graph @f(%x: f32[4,8], %w: f32[8,16] param, %b: f32[16] param) -> (f32[4,16]) {
  %0 = matmul(%x, %w) : f32[4,16]
  %1 = fused(%0, %b) {body="graph @kernel(%x0: f32[4,16], %x1: f32[16]) -> (f32[4,16]) {\n  %0 = add(%x0, %x1) : f32[4,16]\n  %1 = gelu(%0) : f32[4,16]\n  return %1\n}\n"} : f32[4,16]
  return %1
}
