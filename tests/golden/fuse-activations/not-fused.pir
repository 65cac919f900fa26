// RUN: fuse-activations,dce
// Not activations: x * sigmoid(y) with y another value, a sigmoid product whose constant
// broadcasts x to a larger shape, and a tanh kept for another reader (the GELU around it
// still fuses; the tanh stays for its second use).
graph @f(%x: f32[4], %y: f32[4], %m: f32[2,4]) -> (f32[4], f32[2,4], f32[4], f32[4]) {
  %0 = sigmoid(%y) : f32[4]
  %1 = mul(%x, %0) : f32[4]
  %2 = sigmoid(%x) : f32[4]
  %3 = mul(%m, %2) : f32[2,4]
  %h = full() {shape=[], value=0.5} : f32[]
  %4 = mul(%x, %h) : f32[4]
  %p = full() {shape=[], value=3.0} : f32[]
  %5 = pow(%x, %p) : f32[4]
  %c = full() {shape=[], value=0.044715} : f32[]
  %6 = mul(%5, %c) : f32[4]
  %7 = add(%x, %6) : f32[4]
  %s = full() {shape=[], value=0.7978845608028654} : f32[]
  %8 = mul(%7, %s) : f32[4]
  %t = tanh(%8) : f32[4]
  %one = full() {shape=[], value=1.0} : f32[]
  %9 = add(%t, %one) : f32[4]
  %10 = mul(%4, %9) : f32[4]
  return %1, %3, %10, %t
}
// EXPECT:
graph @f(%x: f32[4], %y: f32[4], %m: f32[2,4]) -> (f32[4], f32[2,4], f32[4], f32[4]) {
  %0 = sigmoid(%y) : f32[4]
  %1 = mul(%x, %0) : f32[4]
  %2 = sigmoid(%x) : f32[4]
  %3 = mul(%m, %2) : f32[2,4]
  %p = full() {shape=[], value=3.0} : f32[]
  %4 = pow(%x, %p) : f32[4]
  %c = full() {shape=[], value=0.044715} : f32[]
  %5 = mul(%4, %c) : f32[4]
  %6 = add(%x, %5) : f32[4]
  %s = full() {shape=[], value=0.7978845608028654} : f32[]
  %7 = mul(%6, %s) : f32[4]
  %t = tanh(%7) : f32[4]
  %8 = gelu(%x) {approximate="tanh"} : f32[4]
  return %1, %3, %8, %t
}
