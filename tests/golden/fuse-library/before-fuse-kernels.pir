// RUN: fuse-library,fuse-kernels,dce
// fuse-library runs first and takes the bias add and the activation; fuse-kernels then groups
// what is left (the tanh and mul after the library kernel).
graph @f(%x: f32[4,8], %w: f32[8,16] param, %b: f32[16] param) -> (f32[4,16]) {
  %0 = matmul(%x, %w) : f32[4,16]
  %1 = add(%0, %b) : f32[4,16]
  %2 = silu(%1) : f32[4,16]
  %3 = tanh(%2) : f32[4,16]
  %4 = mul(%3, %2) : f32[4,16]
  return %4
}
// EXPECT:
graph @f(%x: f32[4,8], %w: f32[8,16] param, %b: f32[16] param) -> (f32[4,16]) {
  %0 = linear_pointwise(%x, %w, %b) {unary="silu"} : f32[4,16]
  %1 = fused(%0) {body="graph @kernel(%x0: f32[4,16]) -> (f32[4,16]) {\n  %0 = tanh(%x0) : f32[4,16]\n  %1 = mul(%0, %x0) : f32[4,16]\n  return %1\n}\n"} : f32[4,16]
  return %1
}
