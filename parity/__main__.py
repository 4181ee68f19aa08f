from parity.launch import main

main()
