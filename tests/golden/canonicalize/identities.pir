// RUN: canonicalize
// x*1, 1*x, x+0, 0+x, x-0, x/1, x**1 from the identities on the op records. The result
// keeps the node's type: a broadcast_to where the constant widened the shape, a cast
// where it promoted the dtype. 0-x is not x, and x*2 stays.
graph @f(
    %x: f32[3],
    %i: i32[3]
) -> (f32[3], f32[3], f32[3], f32[3], f32[3], f32[3], f32[3], f32[2,3], f32[3], f32[3], f32[3]) {
  %one = full() {shape=[3], value=1.0} : f32[3]
  %zero = constant() {value=dense<f32[3], 0.0>} : f32[3]
  %wide = full() {shape=[2, 3], value=1.0} : f32[2,3]
  %two = full() {shape=[], value=2.0} : f32[]
  %0 = mul(%x, %one) : f32[3]
  %1 = mul(%one, %x) : f32[3]
  %2 = add(%x, %zero) : f32[3]
  %3 = add(%zero, %x) : f32[3]
  %4 = sub(%x, %zero) : f32[3]
  %5 = div(%x, %one) : f32[3]
  %6 = pow(%x, %one) : f32[3]
  %7 = mul(%x, %wide) : f32[2,3]
  %8 = mul(%i, %one) : f32[3]
  %9 = sub(%zero, %x) : f32[3]
  %10 = mul(%x, %two) : f32[3]
  return %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10
}
// EXPECT:
graph @f(
    %x: f32[3],
    %i: i32[3]
) -> (f32[3], f32[3], f32[3], f32[3], f32[3], f32[3], f32[3], f32[2,3], f32[3], f32[3], f32[3]) {
  %zero = constant() {value=dense<f32[3], 0.0>} : f32[3]
  %two = full() {shape=[], value=2.0} : f32[]
  %0 = broadcast_to(%x) {shape=[2, 3]} : f32[2,3]
  %1 = cast(%i) {dtype=f32} : f32[3]
  %2 = sub(%zero, %x) : f32[3]
  %3 = mul(%x, %two) : f32[3]
  return %x, %x, %x, %x, %x, %x, %x, %0, %1, %2, %3
}
