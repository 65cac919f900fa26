// RUN: fuse-activations,dce
// The erf GELU with the scale as a product by 1/sqrt(2), grouped (x * (1 + erf)) * 0.5,
// in f64.
graph @f(%x: f64[5]) -> (f64[5]) {
  %k = full() {shape=[], value=0.7071067811865476, dtype=f64} : f64[]
  %a = mul(%x, %k) : f64[5]
  %e = erf(%a) : f64[5]
  %one = full() {shape=[], value=1.0, dtype=f64} : f64[]
  %b = add(%e, %one) : f64[5]
  %c = mul(%x, %b) : f64[5]
  %h = full() {shape=[], value=0.5, dtype=f64} : f64[]
  %d = mul(%c, %h) : f64[5]
  return %d
}
// EXPECT:
graph @f(%x: f64[5]) -> (f64[5]) {
  %0 = gelu(%x) : f64[5]
  return %0
}
