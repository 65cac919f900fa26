// RUN: dce
// dropout with train=true draws random numbers (an effect): kept although unused, and so
// is what it reads. With train=false (the default) it is pure and removed.
graph @f(%x: f32[2,3]) -> (f32[2,3]) {
  %0 = relu(%x) : f32[2,3]
  %1 = dropout(%0) {p=0.25, train=true, seed=7} : f32[2,3]
  %2 = exp(%x) : f32[2,3]
  %3 = dropout(%2) : f32[2,3]
  %4 = neg(%x) : f32[2,3]
  return %4
}
// EXPECT:
graph @f(%x: f32[2,3]) -> (f32[2,3]) {
  %0 = relu(%x) : f32[2,3]
  %1 = dropout(%0) {p=0.25, train=true, seed=7} : f32[2,3]
  %2 = neg(%x) : f32[2,3]
  return %2
}
