// RUN: fuse-kernels,dce
// Llama's RMSNorm as transformers writes it: the square, the mean over the hidden dim and
// rsqrt(mean + eps) are one row-reduction kernel (one pass over each row); the scaling by
// that row statistic and the weight is an elementwise kernel reading it through a broadcast.
graph @f(%x: f32[2,4,8], %w: f32[8] param) -> (f32[2,4,8]) {
  %two = full() {shape=[], value=2.0} : f32[]
  %0 = pow(%x, %two) : f32[2,4,8]
  %1 = mean(%0) {axes=[-1], keepdim=true} : f32[2,4,1]
  %eps = full() {shape=[], value=1e-06} : f32[]
  %2 = add(%1, %eps) : f32[2,4,1]
  %3 = rsqrt(%2) : f32[2,4,1]
  %4 = mul(%x, %3) : f32[2,4,8]
  %5 = mul(%w, %4) : f32[2,4,8]
  return %5
}
// EXPECT:
graph @f(%x: f32[2,4,8], %w: f32[8] param) -> (f32[2,4,8]) {
  %0 = fused(%x) {body="graph @kernel(%x0: f32[2,4,8]) -> (f32[2,4,1]) {\n  %0 = full() {shape=[], value=2.0} : f32[]\n  %1 = pow(%x0, %0) : f32[2,4,8]\n  %2 = mean(%1) {axes=[-1], keepdim=true} : f32[2,4,1]\n  %3 = full() {shape=[], value=1e-06} : f32[]\n  %4 = add(%2, %3) : f32[2,4,1]\n  %5 = rsqrt(%4) : f32[2,4,1]\n  return %5\n}\n"} : f32[2,4,1]
  %1 = fused(%x, %0, %w) {body="graph @kernel(%x0: f32[2,4,8], %x1: f32[2,4,1], %x2: f32[8]) -> (f32[2,4,8]) {\n  %0 = mul(%x0, %x1) : f32[2,4,8]\n  %1 = mul(%x2, %0) : f32[2,4,8]\n  return %1\n}\n"} : f32[2,4,8]
  return %1
}
