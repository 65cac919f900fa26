// RUN: fuse-activations,dce
// GPT-2's gelu_new as imported (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))), the erf
// form with the scale written as a division, and x * sigmoid(x) become one op each; a
// chain with another constant (0.05) is not a GELU and stays.
graph @f(%x: f32[2,8], %y: f32[2,8], %z: f32[2,8]) -> (f32[2,8], f32[2,8], f32[2,8], f32[2,8]) {
  %h = full() {shape=[], value=0.5} : f32[]
  %0 = mul(%x, %h) : f32[2,8]
  %1 = full() {shape=[], value=3.0} : f32[]
  %2 = pow(%x, %1) : f32[2,8]
  %c = full() {shape=[], value=0.044715} : f32[]
  %3 = mul(%2, %c) : f32[2,8]
  %4 = add(%x, %3) : f32[2,8]
  %s = full() {shape=[], value=0.7978845608028654} : f32[]
  %5 = mul(%4, %s) : f32[2,8]
  %6 = tanh(%5) : f32[2,8]
  %one = full() {shape=[], value=1.0} : f32[]
  %7 = add(%6, %one) : f32[2,8]
  %8 = mul(%0, %7) : f32[2,8]
  %r = full() {shape=[], value=1.4142135623730951} : f32[]
  %9 = div(%y, %r) : f32[2,8]
  %10 = erf(%9) : f32[2,8]
  %11 = add(%10, %one) : f32[2,8]
  %12 = mul(%y, %11) : f32[2,8]
  %13 = mul(%12, %h) : f32[2,8]
  %14 = sigmoid(%z) : f32[2,8]
  %15 = mul(%z, %14) : f32[2,8]
  %d = full() {shape=[], value=0.05} : f32[]
  %16 = mul(%2, %d) : f32[2,8]
  %17 = add(%x, %16) : f32[2,8]
  %18 = mul(%17, %s) : f32[2,8]
  %19 = tanh(%18) : f32[2,8]
  %20 = add(%19, %one) : f32[2,8]
  %21 = mul(%0, %20) : f32[2,8]
  return %8, %13, %15, %21
}
// EXPECT:
graph @f(%x: f32[2,8], %y: f32[2,8], %z: f32[2,8]) -> (f32[2,8], f32[2,8], f32[2,8], f32[2,8]) {
  %h = full() {shape=[], value=0.5} : f32[]
  %0 = mul(%x, %h) : f32[2,8]
  %1 = full() {shape=[], value=3.0} : f32[]
  %2 = pow(%x, %1) : f32[2,8]
  %s = full() {shape=[], value=0.7978845608028654} : f32[]
  %one = full() {shape=[], value=1.0} : f32[]
  %3 = gelu(%x) {approximate="tanh"} : f32[2,8]
  %4 = gelu(%y) : f32[2,8]
  %5 = silu(%z) : f32[2,8]
  %d = full() {shape=[], value=0.05} : f32[]
  %6 = mul(%2, %d) : f32[2,8]
  %7 = add(%x, %6) : f32[2,8]
  %8 = mul(%7, %s) : f32[2,8]
  %9 = tanh(%8) : f32[2,8]
  %10 = add(%9, %one) : f32[2,8]
  %11 = mul(%0, %10) : f32[2,8]
  return %3, %4, %5, %11
}
