// RUN: dce
// Unused graph inputs are part of the signature and stay; an output used twice stays;
// dead constants go.
graph @f(%x: f32[3], %unused: i64[2], %w: f32[3] param) -> (f32[3], f32[3], f32[3]) {
  %c = full() {shape=[3], value=2.0} : f32[3]
  %k = constant() {value=dense<f32[3], [1.0, 2.0, 3.0]>} : f32[3]
  %0 = mul(%x, %w) : f32[3]
  %1 = add(%0, %k) : f32[3]
  return %0, %0, %x
}
// EXPECT:
graph @f(%x: f32[3], %unused: i64[2], %w: f32[3] param) -> (f32[3], f32[3], f32[3]) {
  %0 = mul(%x, %w) : f32[3]
  return %0, %0, %x
}
